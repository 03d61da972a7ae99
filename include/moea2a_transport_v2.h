/* The interface between the moea2a core and a transport module, version 2: version 1
 * (moea2a_transport_v1.h: the core's offer, the setup, the collectives, the optional
 * members) and two optional members after it, with which a module makes the transport
 * of a shrunk communicator out of the one its ranks had (moea2a_comm_shrink).
 *
 * A version 2 module exports MOEA2A_TRANSPORT_V2_SYMBOL, of type moea2a_transport_v2_t,
 * whose v1.abi_version is MOEA2A_TRANSPORT_V2_ABI_VERSION. The core looks for that
 * symbol first and loads a module that has only MOEA2A_TRANSPORT_SYMBOL as version 2
 * without the two members. The struct is fixed, as version 1's; man moea2a_transport
 * documents every member.
 */
#ifndef MOEA2A_TRANSPORT_V2_H
#define MOEA2A_TRANSPORT_V2_H
#include "moea2a_transport_v1.h"

#define MOEA2A_TRANSPORT_V2_ABI_VERSION 2
#define MOEA2A_TRANSPORT_V2_SYMBOL "moea2a_transport_v2"

typedef struct moea2a_transport_v2 {
    moea2a_transport_v1_t v1; /* every member of version 1; v1.abi_version: 2 */

    /* Optional, both or neither. A shrink is collective over the ranks that stay (the
     * new communicator's), in two steps so that no rank starts what another cannot
     * finish. can_shrink is local: nonzero when parent (this module's state on a
     * communicator these ranks belonged to, live until the core finalizes it, which it
     * does after) can still serve (not aborted). The core calls shrink only when every
     * staying rank's can_shrink said so, and then on all of them: *tcomm becomes the
     * new communicator's state, for core (rank and nranks renumbered), made from
     * parent's: parent_rank[r] is new rank r's rank in parent (ascending); dead is
     * nonzero when some of parent's other ranks died (nothing may wait on them).
     * *mem_types as init_local's. A shrink that fails on any rank sends every rank to
     * init_local and connect, parent untouched. */
    int (*can_shrink)(void *parent);
    int (*shrink)(void *parent, const moea2a_core_v1_t *core, const int *parent_rank, int dead, void **tcomm,
                  unsigned *mem_types);
} moea2a_transport_v2_t;
#endif
