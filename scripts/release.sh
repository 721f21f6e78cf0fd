#!/usr/bin/env bash
# Releases every module of the workspace (go.work) at one version, in
# lockstep, as River releases its own (docs/development.md, "Releasing"):
#
#	scripts/release.sh vX.Y.Z
#
# On a clean work tree whose CHANGELOG.md has a "## vX.Y.Z" section, it
# rewrites every requirement between the modules, and go.work's replaces,
# to vX.Y.Z (tools/release requires); proves the tree publishes at that
# version (scripts/publish-check.sh); commits that change ("Release
# vX.Y.Z"); and tags the commit vX.Y.Z for the root module and DIR/vX.Y.Z
# for each other one (cmd/vX.Y.Z, oncenats/vX.Y.Z, ...). It pushes nothing:
# it prints the one command that pushes the commit and every tag at once.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() {
	echo "release: $*" >&2
	exit 1
}
version=${1:-}
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "usage: scripts/release.sh vX.Y.Z"
[ -z "$(git status --porcelain)" ] || fail "the work tree is not clean"
grep -q "^## $version\b" CHANGELOG.md || fail "CHANGELOG.md has no \"## $version\" section: name the Unreleased ones first"
tool() { GOWORK=off go -C tools/release run . "$@"; }
current=$(tool check) || fail "tools/release check failed (above)"
[ "$(printf '%s\n%s\n' "$current" "$version" | sort -V | head -1)" = "$current" ] ||
	fail "$version is older than $current, the version the modules require"
tags=()
while IFS=$'\t' read -r _ dir; do
	if [ "$dir" = . ]; then tags+=("$version"); else tags+=("$dir/$version"); fi
done < <(tool modules)
for t in "${tags[@]}"; do
	! git rev-parse -q --verify "refs/tags/$t" >/dev/null || fail "tag $t exists"
done

tool requires "$version"
if ! PUBLISH_VERSION=$version scripts/publish-check.sh; then
	git checkout -- .
	fail "not published: the rewrite is undone"
fi
if [ -n "$(git status --porcelain)" ]; then
	git commit -qam "Release $version: every module requires the others at $version"
fi
for t in "${tags[@]}"; do
	git tag -a "$t" -m "Release $t"
done
echo "release: ${#tags[@]} modules tagged $version on $(git rev-parse --short HEAD); publish them with:"
echo "  git push --atomic origin HEAD ${tags[*]}"
