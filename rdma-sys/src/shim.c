/* Each function expands the rdma-core header macro of the same name. */
#include "wrapper.h"

int rdma_sys_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			    struct ibv_port_attr *port_attr)
{
	return ibv_query_port(context, port_num, port_attr);
}

struct ibv_mr *rdma_sys_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				   int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

struct ibv_mr *rdma_sys_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
					size_t length, uint64_t iova,
					int access)
{
	return ibv_reg_mr_iova(pd, addr, length, iova, access);
}
