#include "base/error.h"
#include "moea2a.h"

static const struct { const char *name; size_t size; } dtypes[MOEA2A_NUM_DATATYPES] = {
    [MOEA2A_INT8] = {"int8", 1},       [MOEA2A_UINT8] = {"uint8", 1},
    [MOEA2A_INT32] = {"int32", 4},     [MOEA2A_INT64] = {"int64", 8},
    [MOEA2A_FLOAT16] = {"fp16", 2},    [MOEA2A_BFLOAT16] = {"bf16", 2},
    [MOEA2A_FLOAT32] = {"fp32", 4},    [MOEA2A_FLOAT8_E4M3] = {"fp8_e4m3", 1},
    [MOEA2A_NVFP4] = {"nvfp4", 1},
};

moea2a_result_t moea2a_datatype_size(moea2a_datatype_t dtype, size_t *size)
{
    if (!size) return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_datatype_size: size is NULL");
    if ((unsigned)dtype >= MOEA2A_NUM_DATATYPES)
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "unknown datatype %d (valid: 0..%d)",
                         (int)dtype, MOEA2A_NUM_DATATYPES - 1);
    *size = dtypes[dtype].size;
    return MOEA2A_SUCCESS;
}

const char *moea2a_datatype_name(moea2a_datatype_t dtype)
{
    return (unsigned)dtype < MOEA2A_NUM_DATATYPES ? dtypes[dtype].name : NULL;
}
