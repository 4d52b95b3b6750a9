#!/usr/bin/env bash
# Replace one section of docs/results.md with a benchmark's output (read from stdin).
#
#   scripts/results.sh SECTION COMMAND < OUTPUT
#
# SECTION names a block between `<!-- results: SECTION -->` and `<!-- /results: SECTION -->`
# in docs/results.md; COMMAND is the command that made OUTPUT, written above it with the
# commit it ran on. Empty output (e.g. a root benchmark that skipped) changes nothing and
# exits 1. The Makefile's bench-wire, bench-transport, bench-net and dcqcn-lab targets
# call it.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: scripts/results.sh SECTION COMMAND < OUTPUT" >&2; exit 2; }
section=$1
cmd=$2
root=$(cd "$(dirname "$0")/.." && pwd)
file=$root/docs/results.md
body=$(cat)
if [[ -z ${body//[[:space:]]/} ]]; then
	echo "results: no output for '$section': docs/results.md unchanged" >&2
	exit 1
fi
grep -qF "<!-- results: $section -->" "$file" || {
	echo "results: no section '$section' in $file" >&2
	exit 1
}
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "(no git)")
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit with local changes"
block=$(mktemp)
trap 'rm -f "$block" "$file.new"' EXIT
{
	echo "\`$cmd\` on commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs:"
	echo
	echo '```text'
	printf '%s\n' "$body"
	echo '```'
} >"$block"
awk -v s="$section" -v blockfile="$block" '
	$0 == "<!-- results: " s " -->" { print; while ((getline l < blockfile) > 0) print l; skip = 1; next }
	$0 == "<!-- /results: " s " -->" { skip = 0 }
	!skip { print }
' "$file" >"$file.new"
mv "$file.new" "$file"
echo "results: docs/results.md section '$section' updated" >&2
