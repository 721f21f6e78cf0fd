package cache

import (
	"context"
	"fmt"
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

// EncodeLayout1 encodes a completed value in layout 1, as the release
// before layout 2 wrote it (TestWriteLayout1 holds that release's bytes).
func EncodeLayout1(version int64, fingerprint string, r keystate.Response, large bool) []byte {
	digest := digestOf(fingerprint)
	return encodeLayout1(version, &digest, r, large)
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
