/* The interface between the moea2a core and a transport module, version 3: version 2
 * (moea2a_transport_v2.h: version 1's table and the shrink members) and one optional
 * member after it, through which the module's waits learn of a dead peer from the
 * core's peer watcher.
 *
 * A version 3 module exports MOEA2A_TRANSPORT_V3_SYMBOL, of type moea2a_transport_v3_t,
 * whose v2.v1.abi_version is MOEA2A_TRANSPORT_V3_ABI_VERSION. The core looks for that
 * symbol first, then version 2's, then version 1's, and loads an older module without
 * the members that came later. The struct is fixed, as the earlier ones; man
 * moea2a_transport documents every member.
 */
#ifndef MOEA2A_TRANSPORT_V3_H
#define MOEA2A_TRANSPORT_V3_H
#include <stdint.h>

#include "moea2a_transport_v2.h"

#define MOEA2A_TRANSPORT_V3_ABI_VERSION 3
#define MOEA2A_TRANSPORT_V3_SYMBOL "moea2a_transport_v3"

typedef struct moea2a_transport_v3 {
    moea2a_transport_v2_t v2; /* every member of version 2; v2.v1.abi_version: 3 */

    /* Optional. Once tcomm is connected (or made by shrink), before any collective: dead
     * is a word of the core's that becomes a rank's number + 1 when the core's peer
     * watcher sees that rank die (0 while every watched peer lives; read it with
     * atomic loads; valid until finalize; NULL: no watcher). A module whose host waits
     * would otherwise last until the timeout reads it in them and ends the wait with
     * MOEA2A_ERR_PEER_FAILED naming the rank, within milliseconds of the death. */
    void (*watch)(void *tcomm, const volatile int32_t *dead);
} moea2a_transport_v3_t;
#endif
