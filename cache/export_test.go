package cache

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly/keystate"
)

// SetReadFirst turns Check's GET before the script on or off, for tests and
// benchmarks that compare the two paths.
func SetReadFirst(c *Cache, on bool) { c.readFirst = on }

// SetCompressMin sets the smallest body c stores deflated (0: never).
func SetCompressMin(c *Cache, n int) { c.compressMin = n }

// CompressibleBody is a JSON list of payments of about 2 KiB.
var CompressibleBody = func() []byte {
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := 0; b.Len() < 2048; i++ {
		fmt.Fprintf(&b, `{"id":"pay_%08x%08x","object":"payment","amount":%d,"currency":"usd","status":"succeeded"},`,
			uint32(i*2654435761), uint32(i*40503), 100+i*37)
	}
	return []byte(strings.TrimSuffix(b.String(), ",") + "]}")
}()

// ReadFirst reports whether Check reads the value before the script.
func ReadFirst(c *Cache) bool { return c.readFirst }

// EncodeLayout1 is the completed-value encoder of the release before
// layout 2, kept verbatim (but for the digest argument) so tests can store
// the values that release wrote.
func EncodeLayout1(version int64, fingerprint string, r keystate.Response, large bool) []byte {
	sum := sha256.Sum256([]byte(fingerprint))
	digest := string(sum[:8])
	header := keystate.EncodeHeader(r.Header)
	flag := byte(flagConfirmed)
	switch {
	case large:
		flag = flagMarker
	case header != "":
		flag = flagHeaders
	}
	buf := make([]byte, 0, 40+len(r.ContentType)+len(header)+len(r.Body))
	buf = append(buf, keystate.Completed...)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, version, 10)
	buf = append(buf, ':', flag)
	buf = append(buf, digest...)
	buf = strconv.AppendInt(buf, int64(r.Status), 10)
	if large {
		return buf
	}
	switch r.ContentType {
	case jsonContentType:
	case "":
		buf = append(buf, '-')
	default:
		buf = append(buf, r.ContentType...)
	}
	buf = append(buf, '\n')
	if flag == flagHeaders {
		buf = strconv.AppendInt(buf, int64(len(header)), 10)
		buf = append(buf, '\n')
		buf = append(buf, header...)
	}
	return append(buf, r.Body...)
}

// Do runs cmd the way the cache runs its own commands.
func Do(ctx context.Context, c *Cache, cmd redis.Cmder) error {
	c.do(ctx, cmd)
	return cmd.Err()
}

// PipelineStats returns the round trips c's automatic pipelining made and
// the commands they carried (zeros when it is off).
func PipelineStats(c *Cache) (roundTrips, commands int64) {
	if c.pipe == nil {
		return 0, 0
	}
	return c.pipe.pipelines.Load(), c.pipe.commands.Load()
}
