#!/usr/bin/env bash
# Proves the modules publish as a release tags them (docs/development.md,
# "Releasing"): it checks tools/release's rules (one go line, no replace in
# a go.mod, one version between the modules, go.work's replaces), publishes
# the tree at the next version (PUBLISH_VERSION; by default the version the
# modules require, or the next minor once that one is tagged) into a file
# module proxy (scripts/lib/publish.sh: zipped as the Go proxy zips a tag),
# and then, with GOWORK=off, against that proxy first:
#   - every package of every module, and its tests, loads in the copy
#     rewritten to require that version, its go.mod and go.sum as committed
#     (-mod=readonly): every import resolves to a published module and
#     every embedded file is in its zip (go list -deps -test ./...); the
#     library's module also compiles (go list -export ./...), and cmd/api
#     links below. (The workspace build compiles everything anyway: what
#     publishing can break is resolution, not Go.)
#   - in an empty module, `go get` of each module alone works and every
#     package of it loads;
#   - `go install github.com/onceonly/onceonly/cmd/api@VERSION` works.
# One line of output; on failure, one line of reason.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PUBLISH_NAME=publish-check
. scripts/lib/publish.sh

next=${PUBLISH_VERSION:-$current}
if [ -z "${PUBLISH_VERSION:-}" ] && git rev-parse -q --verify "refs/tags/$current" >/dev/null; then
	IFS=. read -r major minor _ <<<"$current"
	next=$major.$((minor + 1)).0
fi
publish "$next"
# -trimpath: the build cache hits wherever the module cache lies.
GOFLAGS="$GOFLAGS -trimpath"

for m in "${modules[@]}"; do
	dir=$src/${m#*$'\t'}
	cat "$tmp/proxy/go.sum" >>"$dir/go.sum"
	if [ "${m#*$'\t'}" = . ]; then
		step ".: go list -export ./... (GOWORK=off)" go -C "$dir" list -export ./...
	else
		step "${m#*$'\t'}: go list -deps -test ./... (GOWORK=off)" go -C "$dir" list -deps -test ./...
	fi
done

# Every committed checksum, so that the empty modules ask the checksum
# database nothing it has answered before.
cat "$tmp/proxy/go.sum" "$src/go.sum" "$src"/*/go.sum "$src"/*/*/go.sum 2>/dev/null | sort -u >"$tmp/go.sum"
goline=$(sed -n 's/^go //p' "$src/go.mod")
for m in "${modules[@]}"; do
	path=${m%%$'\t'*}
	use=$tmp/use/${m#*$'\t'}
	mkdir -p "$use" && cp "$tmp/go.sum" "$use/go.sum"
	printf 'module example.com/use\n\ngo %s\n' "$goline" >"$use/go.mod"
	step "go get $path@$version (alone)" go -C "$use" get "$path/...@$version"
	step "go list $path/... (after go get)" go -C "$use" list -deps "$path/..."
done

api=github.com/onceonly/onceonly/cmd/api
step "go install $api@$version" env GOBIN="$tmp/bin" go -C "$tmp" install "$api@$version"
step "go version -m api" go version -m "$tmp/bin/api"
grep -Eq "^\s+mod\s+github.com/onceonly/onceonly/cmd\s+$version\s" "$log" ||
	{ echo "publish-check: go install $api@$version: the binary is not of cmd $version" >&2 && exit 1; }

echo "publish-check: ${#modules[@]} modules published at $version load outside the workspace, go get alone, go install cmd/api ($((SECONDS - start))s)"
