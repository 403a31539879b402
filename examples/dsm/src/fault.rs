//! Fault capture: the `SIGSEGV` handler and its hand-off to the fault thread (docs/dsm.md,
//! "The fault path").
//!
//! The handler does only async-signal-safe work: atomics, `write` to an `eventfd`, `futex`,
//! `clock_gettime`, `sched_yield`, `sigaction`, `sigprocmask`, `raise`, `_exit`. A fault
//! outside the window goes to the handler that was installed before ours (Rust's runtime
//! installs one that reports stack overflows), or, if that was the default action, the default
//! is restored and the instruction faults again, so the process dies of `SIGSEGV` as it would
//! without the DSM. A fault inside the window claims a slot, names its address and whether it
//! was a write, wakes the fault thread and sleeps on the slot's futex until the page is
//! installed. If the fault thread cannot install it (the home node died), it prints why and the
//! handler ends the process with `_exit(1)`: returning would fault again forever.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::stats::Histogram;

/// Faults in flight at once (one per application thread that touches the window).
const SLOTS: usize = 64;

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const REQUESTED: u32 = 2;
const DONE: u32 = 3;
const FAILED: u32 = 4;

struct Slot {
    state: AtomicU32,
    addr: AtomicUsize,
    write: AtomicU32,
}

// `AtomicU32::new` in an array initialiser needs a constant.
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    state: AtomicU32::new(FREE),
    addr: AtomicUsize::new(0),
    write: AtomicU32::new(0),
};

static SLOT: [Slot; SLOTS] = [EMPTY; SLOTS];
/// The window the handler serves: `WINDOW_LEN == 0` while no node is live.
static WINDOW_START: AtomicUsize = AtomicUsize::new(0);
static WINDOW_LEN: AtomicUsize = AtomicUsize::new(0);
/// The eventfd that wakes the fault thread.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// Fault-service times, nanoseconds, measured by the handler from entry to return (with
/// `userfaultfd`, by the fault thread from reading the fault to mapping the page).
pub(crate) static LATENCY: Histogram = Histogram::new();
/// Page transfers (the fault thread's fetch call, request to pages in the frames),
/// nanoseconds.
pub(crate) static TRANSFER: Histogram = Histogram::new();
/// Faults served (the handler counts them itself, the `userfaultfd` fault thread as it takes
/// them; the client's counts are by kind).
pub(crate) static HANDLED: AtomicU64 = AtomicU64::new(0);
/// Whether a fault thread is running; cleared when it ends, however it ends (see [`Alive`]).
static ALIVE: AtomicBool = AtomicBool::new(false);

/// Marks the fault thread running while it lives; its drop (also on a panic's unwind) clears
/// the mark, so a handler waiting for it gives up instead of sleeping for ever.
#[derive(Debug)]
pub(crate) struct Alive(());

impl Alive {
    pub(crate) fn new() -> Alive {
        ALIVE.store(true, Ordering::Release);
        Alive(())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        ALIVE.store(false, Ordering::Release);
        // Wake every waiting handler so that it sees the thread is gone.
        for slot in &SLOT {
            futex_wake(&slot.state);
        }
    }
}

/// The action that was installed before ours.
struct Previous(libc::sigaction);
// SAFETY: a plain C struct of a function address, flags and a signal mask; read only.
unsafe impl Sync for Previous {}
// SAFETY: as for `Sync`.
unsafe impl Send for Previous {}
static PREVIOUS: OnceLock<Previous> = OnceLock::new();
/// The previous action was one-shot (`SA_RESETHAND`) and has run: treat it as the default.
static PREVIOUS_RESET: AtomicBool = AtomicBool::new(false);
static INSTALL: Mutex<()> = Mutex::new(());

/// Installs the handler (once per process; it stays, serving whichever window is live).
pub(crate) fn install() -> Result<()> {
    let _guard = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if PREVIOUS.get().is_some() {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid value to fill in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_segv;
    action.sa_sigaction = handler as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: a valid mask to fill.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to sigaction structs; the handler is async-signal-safe (module
    // documentation).
    if unsafe { libc::sigaction(libc::SIGSEGV, &action, &mut old) } != 0 {
        return Err(Error::last_os("sigaction(SIGSEGV)"));
    }
    let _ = PREVIOUS.set(Previous(old));
    Ok(())
}

/// Makes the handler serve `start..start + len`, waking the fault thread through `eventfd`.
pub(crate) fn serve(start: usize, len: usize, eventfd: i32) {
    WAKE.store(eventfd, Ordering::Release);
    WINDOW_START.store(start, Ordering::Release);
    WINDOW_LEN.store(len, Ordering::Release);
}

/// Stops serving a window (faults there then go to the previous handler).
pub(crate) fn unserve() {
    WINDOW_LEN.store(0, Ordering::Release);
    WAKE.store(-1, Ordering::Release);
}

/// A fault waiting for the fault thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    slot: usize,
    /// The faulting address.
    pub(crate) addr: usize,
    /// Whether the access was a write (x86-64 decodes it from the fault; elsewhere a write
    /// to an invalid page faults twice, first as a read).
    pub(crate) write: bool,
}

/// The faults waiting now, each taken off its slot (so it is reported once).
pub(crate) fn pending(out: &mut Vec<Request>) {
    for (i, slot) in SLOT.iter().enumerate() {
        if slot
            .state
            .compare_exchange(REQUESTED, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            out.push(Request {
                slot: i,
                addr: slot.addr.load(Ordering::Relaxed),
                write: slot.write.load(Ordering::Relaxed) != 0,
            });
        }
    }
}

/// Lets the faulting thread go: its page is installed (`ok`) or cannot be (it exits).
pub(crate) fn complete(request: Request, ok: bool) {
    let slot = &SLOT[request.slot];
    slot.state
        .store(if ok { DONE } else { FAILED }, Ordering::Release);
    futex_wake(&slot.state);
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32 that lives forever (a static).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Sleeps while `word` holds `value`, for at most a second.
fn futex_wait(word: &AtomicU32, value: u32) {
    let second = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 that lives forever, with a valid relative
    // timeout; the kernel returns at once if the word no longer holds `value`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            value,
            &second as *const libc::timespec,
        );
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Whether the fault was a write: bit 1 of the page-fault error code on x86-64.
#[cfg(target_arch = "x86_64")]
fn is_write(context: *mut libc::c_void) -> bool {
    if context.is_null() {
        return false;
    }
    // SAFETY: the kernel passes a valid ucontext_t as the third argument of an SA_SIGINFO
    // handler; only a register value is read.
    let err =
        unsafe { (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    err & 2 != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn is_write(_context: *mut libc::c_void) -> bool {
    false
}

fn write_stderr(message: &[u8]) {
    // SAFETY: writes a valid buffer to descriptor 2; write is async-signal-safe.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

extern "C" fn on_segv(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // The interrupted code's errno survives the system calls made here.
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    handle(signal, info, context);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn handle(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t.
    let code = unsafe { (*info).si_code };
    if code <= 0 {
        // Sent by a process (kill, tgkill, sigqueue), not raised by an access: si_addr holds
        // no address. Not ours.
        chain(signal, info, context, true);
        return;
    }
    // SAFETY: a fault's siginfo_t; si_addr is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    let start = WINDOW_START.load(Ordering::Acquire);
    let len = WINDOW_LEN.load(Ordering::Acquire);
    if len == 0 || addr < start || addr - start >= len {
        chain(signal, info, context, false);
        return;
    }
    let began = now_ns();
    let write = is_write(context);
    let slot = loop {
        if let Some(slot) = SLOT.iter().find(|s| {
            s.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }) {
            break slot;
        }
        // More than SLOTS threads faulting at once: let one finish.
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    };
    slot.addr.store(addr, Ordering::Relaxed);
    slot.write.store(u32::from(write), Ordering::Relaxed);
    slot.state.store(REQUESTED, Ordering::Release);
    let one = 1u64;
    let fd = WAKE.load(Ordering::Acquire);
    // SAFETY: an 8-byte write to the eventfd; a closed descriptor only makes it fail.
    let wrote = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    if wrote != 8 {
        write_stderr(b"dsm: a fault in the shared window, but the DSM's fault thread is gone\n");
        // SAFETY: _exit is async-signal-safe and does not return.
        unsafe { libc::_exit(1) };
    }
    loop {
        let state = slot.state.load(Ordering::Acquire);
        match state {
            DONE => break,
            FAILED => {
                // The fault thread printed why.
                // SAFETY: as above.
                unsafe { libc::_exit(1) };
            }
            _ if !ALIVE.load(Ordering::Acquire) => {
                write_stderr(
                    b"dsm: a fault in the shared window, but the DSM's fault thread has ended\n",
                );
                // SAFETY: as above.
                unsafe { libc::_exit(1) };
            }
            _ => futex_wait(&slot.state, state),
        }
    }
    slot.state.store(FREE, Ordering::Release);
    HANDLED.fetch_add(1, Ordering::Relaxed);
    LATENCY.record(now_ns().wrapping_sub(began));
}

/// Hands a signal that is not ours to the previous handler, or restores the default action so
/// that the faulting instruction, executed again, ends the process as usual (a signal some
/// process sent, `resend`, is raised again instead: nothing would repeat it).
fn chain(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
    resend: bool,
) {
    let handler = if PREVIOUS_RESET.load(Ordering::Acquire) {
        libc::SIG_DFL
    } else {
        PREVIOUS.get().map_or(libc::SIG_DFL, |p| p.0.sa_sigaction)
    };
    let flags = PREVIOUS.get().map_or(0, |p| p.0.sa_flags);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is the default action; sigaction is
        // async-signal-safe.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &default, std::ptr::null_mut());
            if resend {
                // Blocked while this handler runs; delivered, with the default action, when
                // it returns.
                libc::raise(signal);
            }
        }
    } else {
        // Run it as the kernel would have: with its own mask added to the blocked signals,
        // and, if it asked for SA_RESETHAND, with the default action restored first.
        // SAFETY: a zeroed sigset_t is valid storage for the current mask.
        let mut blocked: libc::sigset_t = unsafe { std::mem::zeroed() };
        if let Some(p) = PREVIOUS.get() {
            // SAFETY: valid sigset_t pointers; sigprocmask is async-signal-safe and changes
            // the calling thread's mask only.
            unsafe { libc::sigprocmask(libc::SIG_BLOCK, &p.0.sa_mask, &mut blocked) };
        }
        if flags & libc::SA_RESETHAND != 0 {
            // One-shot: from now on the previous action is the default one. Our own handler
            // stays installed (the window's faults still need it).
            PREVIOUS_RESET.store(true, Ordering::Release);
        }
        if flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous action was installed with SA_SIGINFO, so its address is a
            // three-argument handler; it gets the kernel's own arguments.
            let previous: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            previous(signal, info, context);
        } else {
            // SAFETY: without SA_SIGINFO the address is a one-argument handler.
            let previous: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            previous(signal);
        }
        if PREVIOUS.get().is_some() {
            // SAFETY: restores the mask saved above.
            unsafe { libc::sigprocmask(libc::SIG_SETMASK, &blocked, std::ptr::null_mut()) };
        }
    }
}
