#!/bin/sh
# Fails unless the dynamic symbols libtern defines are exactly the functions
# tern.h declares (TERN_API): nothing of the C++ inside leaks, nothing
# declared is missing. Usage: check_exports.sh LIBTERN.so TERN.H
set -eu
lib=$1
header=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Defined dynamic symbols: "ADDR TYPE NAME[@@VERSION]"; the version node
# itself (TERN_1) is an absolute symbol, type A.
nm -D --defined-only "$lib" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/exported"
# Declarations may span lines: join the header, then take each name that
# follows TERN_API and precedes "(".
tr '\n' ' ' <"$header" | grep -o 'TERN_API [a-z][a-z0-9_ *]*tern_[a-z0-9_]*(' |
  sed 's/.*[ *]\(tern_[a-z0-9_]*\)($/\1/' |
  sort -u >"$tmp/declared"
if ! cmp -s "$tmp/exported" "$tmp/declared"; then
  echo "libtern's exports differ from tern.h's TERN_API functions (< exported only, > declared only):" >&2
  diff "$tmp/exported" "$tmp/declared" | grep '^[<>]' | head -40 >&2
  exit 1
fi
echo "libtern exports the $(wc -l <"$tmp/declared") functions tern.h declares, nothing else"
