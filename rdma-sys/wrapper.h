/* The headers rdma-sys binds. bindgen reads this file, and the generated C
 * wrappers of the static inline functions are compiled against it. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

/* Function-like macros that bindgen cannot see. Each forwards to the macro, so
 * the C preprocessor picks what a C caller of the same name would get: the
 * extended ibv_query_port and ibv_reg_mr_iova2, never the ABI-compat exported
 * symbols of those names. */
int rdma_sys_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			    struct ibv_port_attr *port_attr);
struct ibv_mr *rdma_sys_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				   int access);
struct ibv_mr *rdma_sys_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
					size_t length, uint64_t iova,
					int access);
