package cache

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"io"
	"sync"
)

// DefaultCompressMin (512 bytes) is the CompressMin the benchmarks use:
// with it the cache stores a body that long or longer deflated, when
// deflating saves at least an eighth of it. A replay inflates it again.
const DefaultCompressMin = 512

// flateWriters and flateReaders are reused: a fresh flate writer costs
// hundreds of KiB, a fresh reader its 32 KiB window.
var (
	flateWriters = sync.Pool{New: func() any {
		w, _ := flate.NewWriter(nil, flate.BestSpeed) // the level is valid: never an error
		return w
	}}
	flateReaders = sync.Pool{New: func() any { return flate.NewReader(nil) }}
)

// deflate returns <uvarint len(body)><body deflated>, or nil when that is
// not at least an eighth shorter than body.
func deflate(body []byte) []byte {
	var out bytes.Buffer
	out.Grow(len(body) / 2)
	var n [binary.MaxVarintLen64]byte
	out.Write(n[:binary.PutUvarint(n[:], uint64(len(body)))])
	w, _ := flateWriters.Get().(*flate.Writer)
	w.Reset(&out)
	_, _ = w.Write(body) // writes to a bytes.Buffer never fail
	_ = w.Close()
	flateWriters.Put(w)
	if out.Len() > len(body)-len(body)/8 {
		return nil
	}
	return out.Bytes()
}

// inflate reverses deflate.
func inflate(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	// Deflate expands at most 1032 to 1: a larger length is corrupt.
	if k <= 0 || n > 1032*uint64(len(b))+64 {
		return nil, ErrCorrupt
	}
	r, _ := flateReaders.Get().(io.ReadCloser)
	defer flateReaders.Put(r)
	resetter, _ := r.(flate.Resetter)
	if err := resetter.Reset(bytes.NewReader(b[k:]), nil); err != nil {
		return nil, ErrCorrupt
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, ErrCorrupt
	}
	var more [1]byte
	if m, err := r.Read(more[:]); m != 0 || err != io.EOF {
		return nil, ErrCorrupt
	}
	return body, nil
}
