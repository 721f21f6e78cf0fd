#!/usr/bin/env bash
# go mod tidy in every module of the workspace (go.work). go mod tidy
# ignores go.work, and the version the modules require one another at may
# not be published yet; so this tidies a copy of the tree published at that
# version into a file module proxy (scripts/lib/publish.sh), and copies
# every go.mod and go.sum back, less our own modules' checksums (of this
# tree, not of a tag). Once more when a go.mod changed: a module's tidy
# reads the others' published go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
PUBLISH_NAME=tidy
. scripts/lib/publish.sh

for pass in 1 2 3; do
	publish
	changed=
	for m in "${modules[@]}"; do
		dir=${m#*$'\t'}
		step "$dir: go mod tidy" go -C "$src/$dir" mod tidy
		for f in go.mod go.sum; do
			[ -e "$src/$dir/$f" ] || continue
			grep -v '^github.com/onceonly/onceonly[/ ]' "$src/$dir/$f" >"$tmp/$f" || true
			[ "$f" = go.mod ] && cp "$src/$dir/$f" "$tmp/$f"
			if ! cmp -s "$tmp/$f" "$dir/$f"; then
				cp "$tmp/$f" "$dir/$f"
				echo "tidy: $dir/$f"
				[ "$f" = go.mod ] && changed=1
			fi
		done
	done
	[ -n "$changed" ] || exit 0
done
echo "tidy: a go.mod still changes after three passes; run it again" >&2
exit 1
