# Sourced by scripts/publish-check.sh and scripts/tidy.sh, from the root of
# the repository: publishes the tree into a file module proxy, as tags
# would, and points the go command at it, outside the workspace.
#
# Sourcing it builds tools/release ($release) and checks its rules (one go
# line, no replace in a go.mod, one version between the modules, go.work's
# replaces); $current is that version.
#
# publish [VERSION]: copies the tree (git's tracked files, as in
# the work tree) to $src, rewrites it to require VERSION (default $current),
# zips every module at that version ($version) into the file proxy
# $tmp/proxy (nested modules left out, as the Go proxy zips a tag; their
# checksums in $tmp/proxy/go.sum), lists them in $modules ("path<TAB>dir"),
# and exports GOWORK=off, the module cache below (the usual one serves as a
# proxy, so a warm machine downloads nothing) and GOPROXY with the file
# proxy first.
#
# step WHAT CMD...: runs CMD, its output in $log; on failure, exits with
# the reason in one line ($PUBLISH_NAME: WHAT: the first error line), the
# whole output in .data/$PUBLISH_NAME.log. PUBLISH_TIMES=1 prints the
# seconds each step took.

root=$PWD
# A module cache of its own (ONCEONLY_PUBLISH_CACHE), kept between runs for
# the dependencies, one run at a time on a machine. Each run moves it to a
# directory of its own: the go command indexes a module in the cache by its
# directory (GOCACHE), taking it for immutable, and our modules change at
# one version from run to run. Our modules are removed before and after.
cache=${ONCEONLY_PUBLISH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onceonly/publish}
mkdir -p "$cache"
exec {lock}>"$cache/lock"
flock "$lock"
chmod -R u+w "$cache"/run.* 2>/dev/null || true
rm -rf "$cache"/run.*
tmp=$(mktemp -d "$cache/run.XXXXXX")
if [ -d "$cache/mod" ]; then mv "$cache/mod" "$tmp/mod"; fi
ours=("$tmp/mod/github.com/onceonly" "$tmp/mod/cache/download/github.com/onceonly")
forget() { chmod -R u+w "${ours[@]}" 2>/dev/null || true; rm -rf "${ours[@]}"; }
forget
trap 'forget; if [ -d "$tmp/mod" ]; then mv "$tmp/mod" "$cache/mod"; fi; rm -rf "$tmp"' EXIT
log=$tmp/log
src=$tmp/src

step() {
	local what=$1 rc=0 why
	shift
	local t0=$SECONDS
	"$@" >"$log" 2>&1 || rc=$?
	[ -z "${PUBLISH_TIMES:-}" ] || echo "$PUBLISH_NAME: $((SECONDS - t0))s $what" >&2
	if [ "$rc" -ne 0 ]; then
		mkdir -p "$root/.data" && cp "$log" "$root/.data/$PUBLISH_NAME.log"
		why=$(grep -v -e '^go: downloading ' -e '^go: finding ' -e '^go: added ' -e '^go: upgraded ' -e '^# ' -e '^\s*$' "$log" | head -1)
		echo "$PUBLISH_NAME: $what: ${why:-exit status $rc} (.data/$PUBLISH_NAME.log)" >&2
		exit 1
	fi
}

release=$tmp/release
step "building tools/release" env GOWORK=off go -C "$root/tools/release" build -o "$release" .
step "go.mod rules" "$release" -C "$root" check
current=$(cat "$log")

publish() {
	version=${1:-$current}
	rm -rf "$src" "$tmp/proxy" && mkdir -p "$src"
	git -C "$root" ls-files -z | while IFS= read -r -d '' f; do [ -e "$root/$f" ] && printf '%s\0' "$f"; done |
		tar -C "$root" --null -T - -cf - | tar -xf - -C "$src"
	step "rewriting the requirements to $version" "$release" -C "$src" requires "$version"
	step "publishing $version" "$release" -C "$src" publish "$tmp/proxy" "$version"
	mapfile -t modules < <("$release" -C "$src" modules)
	export GOFLAGS GOPROXY GOWORK=off GOMODCACHE=$tmp/mod GONOSUMDB=github.com/onceonly/onceonly GOTOOLCHAIN=local
	GOFLAGS="$(GOWORK= GOFLAGS= go env GOFLAGS) -modcacherw"
	GOPROXY="file://$tmp/proxy,file://$(GOMODCACHE= go env GOMODCACHE)/cache/download,$(GOPROXY= go env GOPROXY)"
}
