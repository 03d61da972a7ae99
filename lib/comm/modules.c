/* Module files on the search path (modules.h). */
#include <dirent.h>
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/modules.h"

#define MODULE_PREFIX "libmoea2a-"
#define MODULE_SUFFIX ".so"
#define MAX_MODULES 32
#define NAME_LEN 32

/* MOEA2A_TRANSPORT_PATH, then <dir of libmoea2a.so>/moea2a (relocated installs), then
 * the configured module directory. */
static void search_path(char *buf, size_t len)
{
    const char *env = getenv("MOEA2A_TRANSPORT_PATH");
    size_t o = (size_t)snprintf(buf, len, "%s", env && *env ? env : "");
    Dl_info info;
    if (dladdr((void *)search_path, &info) && info.dli_fname) {
        char tmp[1024];
        snprintf(tmp, sizeof(tmp), "%s", info.dli_fname);
        o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%s/moea2a", o ? ":" : "", dirname(tmp));
    }
    if (o < len) snprintf(buf + o, len - o, "%s%s", o ? ":" : "", MOEA2A_PKGLIBDIR);
}

int m2a_modules_each(void (*fn)(const char *name, const char *path, void *arg), void *arg)
{
    char path[4096], seen[MAX_MODULES][NAME_LEN];
    int nseen = 0;
    search_path(path, sizeof(path));
    for (char *save, *dir = strtok_r(path, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        DIR *d = opendir(dir);
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d));) {
            size_t n = strlen(e->d_name), pl = strlen(MODULE_PREFIX), sl = strlen(MODULE_SUFFIX);
            if (n <= pl + sl || strncmp(e->d_name, MODULE_PREFIX, pl) || strcmp(e->d_name + n - sl, MODULE_SUFFIX))
                continue;
            char name[NAME_LEN], file[4096 + 256];
            snprintf(name, sizeof(name), "%.*s", (int)(n - pl - sl), e->d_name + pl);
            int dup = 0;
            for (int i = 0; i < nseen; i++) dup |= !strcmp(seen[i], name);
            if (dup || nseen == MAX_MODULES) continue;
            snprintf(seen[nseen++], NAME_LEN, "%s", name);
            snprintf(file, sizeof(file), "%s/%s", dir, e->d_name);
            fn(name, file, arg);
        }
        closedir(d);
    }
    return nseen;
}

typedef struct {
    const char *name;
    char *path;
    size_t len;
    int found;
} find_arg_t;

static void find_one(const char *name, const char *path, void *arg)
{
    find_arg_t *a = arg;
    if (a->found || strcmp(name, a->name)) return;
    snprintf(a->path, a->len, "%s", path);
    a->found = 1;
}

int m2a_module_find(const char *name, char *path, size_t len)
{
    find_arg_t a = {name, path, len, 0};
    m2a_modules_each(find_one, &a);
    return a.found;
}

const void *m2a_module_open(const char *path, const char *symbol, size_t abi_offset, int abi, const char *what,
                            void **dl, char *why, size_t len)
{
    *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*dl) {
        snprintf(why, len, "%s", dlerror());
        return NULL;
    }
    const unsigned char *table = dlsym(*dl, symbol);
    int have = 0;
    if (table) memcpy(&have, table + abi_offset, sizeof(have));
    if (!table)
        snprintf(why, len, "%s has no symbol %s (not %s of moea2a, or another ABI)", path, symbol, what);
    else if (have != abi)
        snprintf(why, len, "%s has ABI version %d, this library needs %d", path, have, abi);
    if (!table || have != abi) {
        dlclose(*dl);
        *dl = NULL;
        return NULL;
    }
    return table;
}
