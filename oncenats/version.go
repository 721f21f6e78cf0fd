package oncenats

import (
	"strconv"
	"strings"
)

// termTakesReason reports whether a server of this version terminates a
// message acked "+TERM <reason>" (2.10.4 and later); older ones ignore
// the whole ack, so the message would come back.
func termTakesReason(version string) bool {
	major, minor, patch, ok := parseVersion(version)
	if !ok {
		return false
	}
	switch {
	case major != 2:
		return major > 2
	case minor != 10:
		return minor > 10
	}
	return patch >= 4
}

// parseVersion reads "2.10.4", "v2.10.4" or "2.11.0-beta.1".
func parseVersion(v string) (major, minor, patch int, ok bool) {
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return 0, 0, 0, false
		}
		n[i] = x
	}
	return n[0], n[1], n[2], true
}
