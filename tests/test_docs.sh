#!/bin/sh
# Documentation and configuration stay complete: every public function has a man
# page, every MOEA2A_* variable the sources read is in the parameter table, and every
# variable of the table is documented in moea2a(7). TAP output.
src=${top_srcdir:-.}; build=${top_builddir:-.}
n=0; failed=0
check() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

missing=""
# (every installed header, the transport modules' interface included)
for f in $(grep -hoE '\bmoea2a_[a-z0-9_]+[[:space:]]*\(' "$src"/include/moea2a*.h |
           sed 's/[[:space:](]//g' | sort -u); do
    [ -f "$src/man/man3/$f.3" ] || missing="$missing $f"
done
[ -z "$missing" ]; check $? "every public function has a man3 page${missing:+ (missing:$missing)}"

# Every function the headers declare with MOEA2A_API is named in the version script, and
# the built library exports it with a version (no wildcard lets one in unplaced).
so=$(ls "$build"/lib/.libs/libmoea2a.so 2>/dev/null | head -1)
api=$(grep -hoE 'MOEA2A_API [^;]*\bmoea2a_[a-z0-9_]+\(' "$src"/include/*.h | grep -oE 'moea2a_[a-z0-9_]+\($' | tr -d '(' | sort -u)
unversioned=""
for f in $api; do
    grep -qE "^[[:space:]]+$f;" "$src/lib/libmoea2a.map" || unversioned="$unversioned $f(map)"
    [ -z "$so" ] || nm -D --defined-only "$so" | grep -q " $f@@MOEA2A_" || unversioned="$unversioned $f(export)"
done
[ -n "$api" ] && [ -z "$unversioned" ] && ! grep -q 'moea2a_\*' "$src/lib/libmoea2a.map"
check $? "every MOEA2A_API function is named in a version node and exported with it${unversioned:+ (missing:$unversioned)}"

table=$("$build/tools/moea2a_info" -c | grep -E '^MOEA2A_[A-Z0-9_]+=' | sed 's/=.*//' | sort -u)
[ -n "$table" ]; check $? "moea2a_info -c lists the variables"
used=$(grep -rhoE '(getenv|m2a_param_[a-z]+)\((NULL, |comm, )?"MOEA2A_[A-Z0-9_]+"' "$src/lib" "$src/transports" "$src/tools" 2>/dev/null |
       grep -oE 'MOEA2A_[A-Z0-9_]+' | sort -u)
undeclared=""
for v in $used; do echo "$table" | grep -qx "$v" || undeclared="$undeclared $v"; done
[ -z "$undeclared" ]; check $? "every variable the sources read is declared in the table${undeclared:+ (undeclared:$undeclared)}"
undocumented=""
for v in $table; do grep -q "$v" "$src/man/man7/moea2a.7" || undocumented="$undocumented $v"; done
[ -z "$undocumented" ]; check $? "every variable is documented in moea2a(7)${undocumented:+ (missing:$undocumented)}"
dashes=$(grep -l -e '\\\[en\]' -e '\\f\[B\]--' -e '\\f\[B\]-[A-Za-z]' "$src"/man/man[137]/*.[137] 2>/dev/null | tr '\n' ' ')
[ -z "$dashes" ]; check $? "options in the man pages are ASCII minus signs, not en dashes or hyphens${dashes:+ ($dashes)}"
# pandoc reads $...$ as TeX math: "$(libdir)" pairs in man/md must be written \$ to survive
lost=$(grep -L '\$(libdir)/libmoea2a.so' "$src/man/man7/moea2a.7")
[ -z "$lost" ]; check $? "moea2a(7) FILES shows \$(libdir) paths as written (no TeX math)"
sourced=$(env -i PATH="$PATH" sh -c "eval \"\$(\"$build/tools/moea2a_info\" -c)\" && echo \"\$MOEA2A_DEBUG \$MOEA2A_NUM_SMS\"" 2>&1)
[ "$sourced" = "WARN 0" ]; check $? "moea2a_info -c is NAME=value lines a shell can source (got '$sourced')"
shown=$(MOEA2A_KEY=do-not-print-this "$build/tools/moea2a_info" -c | grep -c do-not-print-this)
[ "$shown" = 0 ]; check $? "moea2a_info -c never prints the value of MOEA2A_KEY"
echo "1..$n"
exit $failed
