/* Which memory a pointer is in (memtype.c), asked of the CUDA driver when one is
 * loaded: MOEA2A_MEM_HOST or MOEA2A_MEM_CUDA. */
#ifndef M2A_MEMTYPE_H
#define M2A_MEMTYPE_H
unsigned m2a_memtype(const void *ptr);
#endif
