//! [`Routes`] and [`RouteCache`]: how a completion queue reaches the tables of the queue pairs
//! that complete into it, and [`take_completed`], the lookup of a completion's request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Entry, OWNED_ID_BIT, QpTables, RECV_ID_BIT};

/// How a completion queue reaches the tables of a queue pair that completes into it.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) qp_num: u32,
    pub(crate) tables: Arc<QpTables>,
    /// The queue pair's send queue completes here.
    pub(crate) send: bool,
    /// Its receive queue completes here.
    pub(crate) recv: bool,
}

/// The routes of one completion queue: written when a queue pair is created on it or
/// destroyed; its poller reads them through a [`RouteCache`].
#[derive(Debug, Default)]
pub(crate) struct Routes {
    routes: Mutex<Vec<Route>>,
    /// Counts the changes of `routes`: a cache whose count differs reloads.
    generation: AtomicU64,
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, Vec<Route>> {
        self.routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a queue pair's route (or marks its other queue on the route it has here).
    pub(crate) fn add(&self, qp_num: u32, tables: &Arc<QpTables>, send: bool, recv: bool) {
        let mut routes = self.lock();
        if let Some(route) = routes.iter_mut().find(|r| Arc::ptr_eq(&r.tables, tables)) {
            route.send |= send;
            route.recv |= recv;
        } else {
            routes.push(Route {
                qp_num,
                tables: tables.clone(),
                send,
                recv,
            });
        }
        // Release, under the lock: a cache that sees the new count reloads the new routes.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Removes the route to `tables` (its queue pair was destroyed).
    pub(crate) fn remove(&self, tables: &Arc<QpTables>) {
        self.lock().retain(|r| !Arc::ptr_eq(&r.tables, tables));
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// A poller's copy of a completion queue's routes, reloaded when they change (a queue pair
/// created on the queue or destroyed), so that a completion finds its tables without a lock.
///
/// The copy is checked after every batch polled, before its completions are matched, and a
/// queue pair's route is added before it can post; and an owned completion that matches
/// nothing in the copy reloads it and looks again (see
/// [`take_completed`](Self::take_completed)), so no completion is missed for a copy too old.
/// A copy that still has a destroyed queue pair's route is harmless: a completion is matched
/// by its request's id, which is in flight in one table only, and a destroyed queue pair's
/// tables were emptied by its destruction.
#[derive(Debug)]
pub(crate) struct RouteCache {
    generation: u64,
    routes: Vec<Route>,
}

impl RouteCache {
    /// Routes a queue's copy has room for from its creation: reloading the copy allocates only
    /// when more queue pairs than this complete into the queue (once, when they are created),
    /// never per request.
    const ROOM: usize = 8;

    /// An empty copy with room for [`ROOM`](Self::ROOM) routes.
    pub(crate) fn new() -> Self {
        Self {
            generation: 0,
            routes: Vec::with_capacity(Self::ROOM),
        }
    }

    /// Reloads the copy if `routes` changed since it was taken: one load when they did not.
    #[inline]
    pub(crate) fn refresh(&mut self, routes: &Routes) {
        if routes.generation.load(Ordering::Acquire) != self.generation {
            self.reload(routes);
        }
    }

    #[cold]
    #[inline(never)]
    fn reload(&mut self, routes: &Routes) {
        let locked = routes.lock();
        // Reuses the copy's storage: allocates only when there are more routes than ever.
        self.routes.clone_from(&locked);
        self.generation = routes.generation.load(Ordering::Relaxed);
    }

    /// Finds the owned request a completion of queue pair `qp_num` with `wr_id` ends: takes
    /// it from its table (releasing the requests before it) into `out`. `false`, `out` left
    /// `None`, for a completion of no owned request.
    ///
    /// An owned id that matches nothing makes it reload the copy from `routes` and look once
    /// more: Rust's memory model does not order a route's addition (on the thread that created
    /// the queue pair) before the load of the change count that follows a poll, since what
    /// links them goes through the device. A stale completion (its request released by a reset
    /// or destroy) takes that path too, which costs a lock, not an allocation (the copy reuses
    /// its storage).
    ///
    /// The entry is moved into `out`, which holds `None` (overwritten, not dropped); returns
    /// whether one was.
    #[inline]
    pub(crate) fn take_completed(
        &mut self,
        routes: &Routes,
        qp_num: u32,
        wr_id: u64,
        out: &mut Option<Entry>,
    ) -> bool {
        if take_completed(&self.routes, qp_num, wr_id, out) {
            return true;
        }
        if wr_id & OWNED_ID_BIT == 0 {
            return false;
        }
        self.retry(routes, qp_num, wr_id, out)
    }

    /// [`take_completed`](Self::take_completed)'s second look, after a reload.
    #[cold]
    #[inline(never)]
    fn retry(&mut self, routes: &Routes, qp_num: u32, wr_id: u64, out: &mut Option<Entry>) -> bool {
        self.reload(routes);
        take_completed(&self.routes, qp_num, wr_id, out)
    }
}

/// Finds the owned request a completion of queue pair `qp_num` with `wr_id` ends, among
/// `routes`: moves it from its table into `out`, which holds `None` (releasing the requests
/// before it), and returns `true`; `false`, `out` left `None`, for a completion of no owned
/// request.
#[inline(always)]
pub(crate) fn take_completed(
    routes: &[Route],
    qp_num: u32,
    wr_id: u64,
    out: &mut Option<Entry>,
) -> bool {
    if wr_id & OWNED_ID_BIT == 0 {
        return false;
    }
    // Ids are unique in the process, so at most one table holds it; several routes share a
    // number only while a destroyed queue pair's route is being removed. The receive bit says
    // which queue's table to look in (an SRQ's, for a queue pair on one).
    let recv = wr_id & RECV_ID_BIT != 0;
    for route in routes.iter().filter(|r| r.qp_num == qp_num) {
        let found = if !recv {
            route.send && route.tables.send.complete_into(wr_id, out)
        } else if !route.recv {
            false
        } else {
            match &route.tables.srq {
                Some(srq) => match srq.take(wr_id) {
                    Some(entry) => {
                        debug_assert!(out.is_none(), "an entry would leak");
                        // SAFETY: `out` is a `&mut`, so valid and aligned; what it held
                        // (`None`) is overwritten, not dropped, which keeps drop code for it
                        // out of the inlined poll loop.
                        unsafe { std::ptr::write(out, Some(entry)) };
                        true
                    }
                    None => false,
                },
                None => route.tables.recv.complete_into(wr_id, out),
            }
        };
        if found {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::SrqTable;
    use crate::inflight::ring::tests::push;

    /// [`take_completed`], its entry as an `Option`.
    fn take(routes: &[Route], qp_num: u32, wr_id: u64) -> Option<Entry> {
        let mut out = None;
        let found = take_completed(routes, qp_num, wr_id, &mut out);
        assert_eq!(found, out.is_some(), "returns whether it wrote");
        out
    }

    #[test]
    fn only_owned_ids_are_looked_up() {
        let tables = Arc::new(QpTables::new(2, 2, None));
        let (id, _) = push(&tables.recv, 7);
        let routes = vec![Route {
            qp_num: 5,
            tables: tables.clone(),
            send: false,
            recv: true,
        }];
        assert!(take(&routes, 5, id & !OWNED_ID_BIT).is_none());
        assert!(take(&routes, 6, id).is_none(), "another queue pair");
        assert_eq!(take(&routes, 5, id).unwrap().tag, 7);
        assert!(take(&routes, 5, id).is_none(), "taken once");
    }

    /// A poller's copy taken before a queue pair's route was added still finds that queue
    /// pair's completion (the second look, after a reload), once; a stale id and a foreign
    /// one leave `out` `None`, and a route removed while the copy still has it finds nothing
    /// (its tables were emptied).
    #[test]
    fn an_old_copy_reloads_and_finds_the_completion() {
        let routes = Routes::default();
        let mut cache = RouteCache::new();
        cache.refresh(&routes);
        let tables = Arc::new(QpTables::new(2, 2, None));
        routes.add(4, &tables, true, false);
        let (id, _) = push(&tables.send, 11);
        let mut take = |wr_id| {
            let mut out = None;
            let found = cache.take_completed(&routes, 4, wr_id, &mut out);
            assert_eq!(found, out.is_some(), "returns whether it wrote");
            out
        };
        assert_eq!(take(id).map(|entry| entry.tag), Some(11));
        assert!(take(id).is_none(), "taken once");
        assert!(take(id & !OWNED_ID_BIT).is_none(), "not an owned id");
        let (late, _) = push(&tables.send, 12);
        tables.clear();
        routes.remove(&tables);
        assert!(take(late).is_none(), "released by the destroy");
    }

    /// A completion is looked up only in the queue its id names (send or receive), only on a
    /// route that carries that queue, in the SRQ's table for a queue pair on one, and past a
    /// route of the same number whose tables do not hold it (a destroyed queue pair's, not yet
    /// removed).
    #[test]
    fn lookups_follow_the_id_and_the_route() {
        let srq = Arc::new(SrqTable::new(4));
        let old = Arc::new(QpTables::new(2, 2, None));
        let live = Arc::new(QpTables::new(2, 2, Some(srq.clone())));
        let (send, _) = push(&live.send, 1);
        let (recv, _) = push(&live.recv, 2);
        let on_srq = srq.push(3, None, None).unwrap();
        let route = |tables: &Arc<QpTables>, send, recv| Route {
            qp_num: 9,
            tables: tables.clone(),
            send,
            recv,
        };
        // The send queue completes elsewhere: the send id is not looked up here.
        let routes = [route(&old, true, true), route(&live, false, true)];
        assert!(take(&routes, 9, send).is_none());
        // The receive id: this queue pair is on the SRQ, so its own receive ring is not used.
        assert!(take(&routes, 9, recv).is_none());
        assert_eq!(take(&routes, 9, on_srq).unwrap().tag, 3);
        let routes = [route(&old, true, true), route(&live, true, false)];
        assert_eq!(take(&routes, 9, send).unwrap().tag, 1);
        assert_eq!((live.send.len(), live.recv.len(), srq.len()), (0, 1, 0));
    }
}
