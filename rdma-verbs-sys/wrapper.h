/* Headers that rdma-verbs-sys binds. Regenerate with `cargo xtask bindgen`. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
