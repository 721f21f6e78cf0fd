package kafkatest

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Header returns the value of rec's header name, "" without one.
func Header(rec *kgo.Record, name string) string {
	for _, h := range rec.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// Lag returns how many records of topic group has not committed past,
// over every partition: all of them while the group has committed nothing
// (or is not known yet).
func Lag(ctx context.Context, adm *kadm.Client, group, topic string) (int, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("the end offsets of %s: %w", topic, err)
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return 0, fmt.Errorf("the offsets of group %s: %w", group, err)
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := offs.Lookup(topic, o.Partition); ok && c.Err == nil && c.At > 0 {
			at = c.At
		}
		n += int(o.Offset - at)
	})
	return n, nil
}
