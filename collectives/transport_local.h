/* collectives/transport_local.h — PRIVATE. The in-process transport: ranks
 * are threads of one process sharing a "world". Used by dt_launch. */
#ifndef DT_TRANSPORT_LOCAL_H
#define DT_TRANSPORT_LOCAL_H

#include "transport.h"

typedef struct dt_local_world dt_local_world;

/* A world of `size` ranks, its communicators configured by cfg. */
dt_status dt_local_world_create(int size, const dt_comm_config *cfg, dt_local_world **out);
/* The world communicator handle of `rank` (caller owns it: dt_comm_destroy).
 * `mem` says where the rank's buffers live (copied; NULL: dt_mem_host); its
 * arg (a CUDA backend) must outlive the handle and every split of it. */
dt_status dt_local_world_comm(dt_local_world *world, int rank, const dt_mem *mem,
                              dt_comm **out);
/* Abort from outside a communicator (a rank whose function failed). */
void dt_local_world_abort(dt_local_world *world, int rank, dt_status status,
                          const char *reason);
/* First abort recorded: its status (DT_SUCCESS if none), rank and message. */
dt_status dt_local_world_first_failure(dt_local_world *world, int *rank,
                                       char *msg, size_t msg_size);
/* Free the world and any communicator state still attached to it. Every
 * rank thread must have finished. Accepts NULL. */
void dt_local_world_destroy(dt_local_world *world);

#endif /* DT_TRANSPORT_LOCAL_H */
