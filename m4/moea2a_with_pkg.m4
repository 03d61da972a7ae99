# MOEA2A_WITH_PKG(NAME, PKG-CONFIG-MODULE, HEADER, SYMBOL, LIBS, GUESS-PREFIXES, [EXTRA-CPPFLAGS])
#
# Adds --with-NAME[=DIR] the way UCX and libfabric do it:
#   (unset)  guess: pkg-config, then the default search path, then GUESS-PREFIXES;
#            finding nothing is a warning and turns NAME off;
#   yes      the same search, but finding nothing is an error;
#   DIR      only DIR/include and DIR/lib64 or DIR/lib; failure is an error;
#   no       NAME is off.
# A candidate is accepted when a program including HEADER and taking the address of
# SYMBOL compiles and links with it (one check for header and library together).
# Sets and AC_SUBSTs NAME_CPPFLAGS, NAME_LDFLAGS, NAME_LIBS (NAME upper-cased) and
# sets the shell variable have_NAME to yes or no.
AC_DEFUN([MOEA2A_WITH_PKG], [
m4_pushdef([UP], m4_translit(m4_toupper([$1]), [-], [_]))dnl
AC_ARG_WITH([$1],
    [AS_HELP_STRING([--with-$1@<:@=DIR@:>@], [use $1, optionally installed in DIR (default: guess)])],
    [], [with_$1=guess])
UP[]_CPPFLAGS=""; UP[]_LDFLAGS=""; UP[]_LIBS=""; have_$1=no
AS_IF([test "x$with_$1" != xno], [
    AC_MSG_CHECKING([for $1])
    moea2a_cands=""
    AS_CASE(["$with_$1"],
      [guess|yes], [
        m4_ifnblank([$2], [
        AS_IF([test -n "$PKG_CONFIG" && $PKG_CONFIG --exists '$2' 2>/dev/null], [
            moea2a_cands="pkgconfig"])])
        moea2a_cands="$moea2a_cands system $6"],
      [moea2a_cands="$with_$1"])
    for moea2a_cand in $moea2a_cands; do
        AS_CASE([$moea2a_cand],
          [pkgconfig], [moea2a_cpp=`$PKG_CONFIG --cflags '$2'`
                        moea2a_ld=""
                        moea2a_libs=`$PKG_CONFIG --libs '$2'`],
          [system],    [moea2a_cpp=""; moea2a_ld=""; moea2a_libs="$5"],
          [moea2a_cpp="-I$moea2a_cand/include"
           moea2a_ld=""
           # lib64, the multiarch directory (Debian/Ubuntu packages), lib: all that exist
           moea2a_multiarch=`$CC -print-multiarch 2>/dev/null`
           for moea2a_l in lib64 ${moea2a_multiarch:+lib/$moea2a_multiarch} lib; do
               AS_IF([test -d "$moea2a_cand/$moea2a_l"], [moea2a_ld="$moea2a_ld -L$moea2a_cand/$moea2a_l"])
           done
           moea2a_libs="$5"])
        # An explicit DIR must hold the header itself, not lean on the system's copy.
        AS_CASE([$moea2a_cand], [pkgconfig|system], [],
                [AS_IF([test ! -f "$moea2a_cand/include/$3"], [continue])])
        moea2a_save_CPPFLAGS=$CPPFLAGS; moea2a_save_LDFLAGS=$LDFLAGS; moea2a_save_LIBS=$LIBS
        CPPFLAGS="$CPPFLAGS $moea2a_cpp $7"; LDFLAGS="$LDFLAGS $moea2a_ld"; LIBS="$moea2a_libs $LIBS"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <$3>]], [[void *volatile p = (void *)&$4; (void)p;]])],
                       [have_$1=yes])
        CPPFLAGS=$moea2a_save_CPPFLAGS; LDFLAGS=$moea2a_save_LDFLAGS; LIBS=$moea2a_save_LIBS
        AS_IF([test "x$have_$1" = xyes], [
            UP[]_CPPFLAGS="$moea2a_cpp"; UP[]_LDFLAGS="$moea2a_ld"; UP[]_LIBS="$moea2a_libs"
            break])
    done
    AS_IF([test "x$have_$1" = xyes],
          [AC_MSG_RESULT([yes ($moea2a_cand)])],
          [AC_MSG_RESULT([no])
           AS_IF([test "x$with_$1" = xguess],
                 [AC_MSG_WARN([$1 not found: building without it (use --with-$1=DIR to point at it)])],
                 [AC_MSG_ERROR([--with-$1=$with_$1 was requested but $3 / $4 could not be compiled and linked])])])
])
AC_SUBST(UP[_CPPFLAGS])
AC_SUBST(UP[_LDFLAGS])
AC_SUBST(UP[_LIBS])
m4_popdef([UP])dnl
])

# MOEA2A_HEADER_INT(VAR, EXPR, HEADER, CPPFLAGS): VAR = the integer EXPR, or "unknown".
AC_DEFUN([MOEA2A_HEADER_INT], [
moea2a_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $4"
AC_COMPUTE_INT([$1], [$2], [#include <$3>], [$1=unknown])
CPPFLAGS=$moea2a_save_CPPFLAGS
])
