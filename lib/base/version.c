#include "config.h"
#include "base/error.h"
#include "moea2a.h"

moea2a_result_t moea2a_get_version(int *major, int *minor, int *patch)
{
    if (!major || !minor || !patch)
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_version: NULL output pointer");
    *major = MOEA2A_VERSION_MAJOR;
    *minor = MOEA2A_VERSION_MINOR;
    *patch = MOEA2A_VERSION_PATCH;
    return MOEA2A_SUCCESS;
}

const char *moea2a_get_build_config(void) { return MOEA2A_BUILD_CONFIG; }
