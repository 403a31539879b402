/*
 * post_poll: the C reference for `benches/src/bin/instructions.rs`. The same round on the same
 * set-up, written against libibverbs as a C program would: post a receive, post a 64-byte
 * signaled SEND, wait for both completions on a completion channel, poll each queue once.
 *
 *   post_poll <device> <port> <gid-index> <rounds>
 *
 * Only the functions named measured_* are meant to be counted:
 *
 *   valgrind --tool=callgrind --toggle-collect='measured_*' post_poll rxe0 1 1 2000
 *
 * `cargo xtask instructions` builds it (cc -O2, as distributions build rdma-core and perftest)
 * and runs it next to the Rust modes; `instructions device` prints the three device arguments.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define SIZE 64
#define WAIT_MS 10000

struct pair {
	struct ibv_context *context;
	struct ibv_comp_channel *channel;
	struct ibv_pd *pd;
	struct ibv_cq *cq_a, *cq_b;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
	char *buf;
};

static int fail(const char *what)
{
	fprintf(stderr, "post_poll: %s: %s\n", what, strerror(errno));
	return 1;
}

static int connect_qp(struct ibv_qp *qp, uint32_t peer, uint8_t port, int gid_index,
		      const union ibv_gid *gid, uint16_t lid, int global)
{
	struct ibv_qp_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = port;
	if (ibv_modify_qp(qp, &attr,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = peer;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.dlid = lid;
	attr.ah_attr.port_num = port;
	if (global) {
		attr.ah_attr.is_global = 1;
		attr.ah_attr.grh.dgid = *gid;
		attr.ah_attr.grh.sgid_index = gid_index;
		attr.ah_attr.grh.hop_limit = 1;
	}
	if (ibv_modify_qp(qp, &attr,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &attr,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr init;

	memset(&init, 0, sizeof(init));
	init.send_cq = cq;
	init.recv_cq = cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 16;
	init.cap.max_recv_wr = 16;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &init);
}

static int open_pair(struct pair *p, const char *name, uint8_t port, int gid_index)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_port_attr port_attr;
	union ibv_gid gid;
	int i;

	if (!list)
		return fail("ibv_get_device_list");
	for (i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			break;
	if (!list[i]) {
		fprintf(stderr, "post_poll: no device %s\n", name);
		return 1;
	}
	p->context = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!p->context)
		return fail("ibv_open_device");
	if (ibv_query_port(p->context, port, &port_attr))
		return fail("ibv_query_port");
	if (ibv_query_gid(p->context, port, gid_index, &gid))
		return fail("ibv_query_gid");
	p->channel = ibv_create_comp_channel(p->context);
	if (!p->channel)
		return fail("ibv_create_comp_channel");
	p->cq_a = ibv_create_cq(p->context, 16, NULL, p->channel, 0);
	p->cq_b = ibv_create_cq(p->context, 16, NULL, p->channel, 0);
	if (!p->cq_a || !p->cq_b)
		return fail("ibv_create_cq");
	p->pd = ibv_alloc_pd(p->context);
	if (!p->pd)
		return fail("ibv_alloc_pd");
	p->a = create_qp(p->pd, p->cq_a);
	p->b = create_qp(p->pd, p->cq_b);
	if (!p->a || !p->b)
		return fail("ibv_create_qp");
	int global = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
	if (connect_qp(p->a, p->b->qp_num, port, gid_index, &gid, port_attr.lid, global) ||
	    connect_qp(p->b, p->a->qp_num, port, gid_index, &gid, port_attr.lid, global))
		return fail("ibv_modify_qp");
	p->buf = calloc(2, SIZE);
	if (!p->buf)
		return fail("calloc");
	memset(p->buf, 0x5a, SIZE);
	p->mr = ibv_reg_mr(p->pd, p->buf, 2 * SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!p->mr)
		return fail("ibv_reg_mr");
	return 0;
}

/* Waits until both queues signalled (acknowledging each event). */
static int wait_both(struct pair *p)
{
	int a = 0, b = 0;

	while (!(a && b)) {
		struct pollfd pfd = { .fd = p->channel->fd, .events = POLLIN };
		struct ibv_cq *cq;
		void *cq_context;

		if (poll(&pfd, 1, WAIT_MS) != 1) {
			fprintf(stderr, "post_poll: no completion event within %d ms\n", WAIT_MS);
			return -1;
		}
		if (ibv_get_cq_event(p->channel, &cq, &cq_context))
			return fail("ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
		a |= cq == p->cq_a;
		b |= cq == p->cq_b;
	}
	return 0;
}

__attribute__((noinline)) int measured_post_recv_c(struct ibv_qp *qp, struct ibv_mr *mr)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)mr->addr + SIZE,
		.length = SIZE,
		.lkey = mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

__attribute__((noinline)) int measured_post_send_c(struct ibv_qp *qp, struct ibv_mr *mr)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)mr->addr,
		.length = SIZE,
		.lkey = mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 2,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;

	return ibv_post_send(qp, &wr, &bad);
}

__attribute__((noinline)) int measured_poll_c(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 4, wc);
}

int main(int argc, char **argv)
{
	struct pair p;
	struct ibv_wc wc[4];
	char *end;
	long rounds;

	if (argc != 5) {
		fprintf(stderr, "usage: post_poll <device> <port> <gid-index> <rounds>\n");
		return 1;
	}
	rounds = strtol(argv[4], &end, 10);
	if (*end || rounds <= 0) {
		fprintf(stderr, "post_poll: the rounds must be a positive number\n");
		return 1;
	}
	memset(&p, 0, sizeof(p));
	if (open_pair(&p, argv[1], (uint8_t)atoi(argv[2]), atoi(argv[3])))
		return 1;
	for (long round = 0; round < rounds; round++) {
		int sent, received;

		if (ibv_req_notify_cq(p.cq_a, 0) || ibv_req_notify_cq(p.cq_b, 0))
			return fail("ibv_req_notify_cq");
		if (measured_post_recv_c(p.b, p.mr))
			return fail("ibv_post_recv");
		if (measured_post_send_c(p.a, p.mr))
			return fail("ibv_post_send");
		if (wait_both(&p))
			return 1;
		sent = measured_poll_c(p.cq_a, wc);
		if (sent == 1 && (wc[0].status != IBV_WC_SUCCESS || wc[0].opcode != IBV_WC_SEND))
			sent = -1;
		received = measured_poll_c(p.cq_b, wc);
		if (received == 1 &&
		    (wc[0].status != IBV_WC_SUCCESS || wc[0].opcode != IBV_WC_RECV ||
		     wc[0].byte_len != SIZE))
			received = -1;
		if (sent != 1 || received != 1) {
			fprintf(stderr, "post_poll: round %ld: polled %d and %d\n", round, sent,
				received);
			return 1;
		}
	}
	if (memcmp(p.buf, p.buf + SIZE, SIZE)) {
		fprintf(stderr, "post_poll: the received bytes differ from the sent ones\n");
		return 1;
	}
	ibv_destroy_qp(p.a);
	ibv_destroy_qp(p.b);
	ibv_dereg_mr(p.mr);
	ibv_destroy_cq(p.cq_a);
	ibv_destroy_cq(p.cq_b);
	ibv_destroy_comp_channel(p.channel);
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.context);
	free(p.buf);
	printf("c: %ld rounds\n", rounds);
	return 0;
}
