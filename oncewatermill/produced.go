package oncewatermill

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceonly/onceonly"
)

// ResultContentType is the Content-Type of the Result a message's first
// execution stores: the messages its handler returned, as JSON.
const ResultContentType = "application/vnd.oncewatermill.produced+json"

// storedResult is the body of that Result. A handler that returned no
// messages stores no body.
type storedResult struct {
	Messages []storedMessage `json:"messages"`
}

// storedMessage is one produced message, all of it that a publisher
// sends: its UUID, metadata and payload (base64 in JSON).
type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

// encodeProduced returns the Result that stores msgs.
func encodeProduced(msgs []*message.Message) (onceonly.Result, error) {
	res := onceonly.Result{Status: 200, ContentType: ResultContentType}
	if len(msgs) == 0 {
		return res, nil
	}
	stored := storedResult{Messages: make([]storedMessage, len(msgs))}
	for i, msg := range msgs {
		if msg == nil {
			return onceonly.Result{}, fmt.Errorf("oncewatermill: the handler returned a nil message (index %d)", i)
		}
		stored.Messages[i] = storedMessage{UUID: msg.UUID, Metadata: msg.Metadata, Payload: msg.Payload}
	}
	body, err := json.Marshal(stored)
	if err != nil {
		return onceonly.Result{}, fmt.Errorf("oncewatermill: encode produced messages: %w", err)
	}
	res.Body = body
	return res, nil
}

// errNotProduced marks a stored Result this package did not write: the
// key was completed by something else (an HTTP request, another consumer)
// in the same scope.
var errNotProduced = errors.New("oncewatermill: the key's stored result holds no produced messages")

// decodeProduced returns the messages res stores, new ones on each call:
// the router sets their context, and a publisher may change them.
func decodeProduced(res onceonly.Result) ([]*message.Message, error) {
	if res.ContentType != ResultContentType {
		return nil, fmt.Errorf("%w (Content-Type %q): was it completed by other code in the same scope?", errNotProduced, res.ContentType)
	}
	if len(res.Body) == 0 {
		return nil, nil
	}
	var stored storedResult
	if err := json.Unmarshal(res.Body, &stored); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotProduced, err)
	}
	msgs := make([]*message.Message, len(stored.Messages))
	for i, s := range stored.Messages {
		msg := message.NewMessage(s.UUID, s.Payload)
		for k, v := range s.Metadata {
			msg.Metadata.Set(k, v)
		}
		msgs[i] = msg
	}
	return msgs, nil
}
