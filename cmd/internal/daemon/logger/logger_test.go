package logger_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/cmd/internal/daemon/logger"
)

func TestFormats(t *testing.T) {
	var buf bytes.Buffer
	log, err := logger.New(&buf, "info", "json")
	require.NoError(t, err)
	log.Info("hello", "n", 1)
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	require.Equal(t, "hello", line["msg"])
	require.InDelta(t, 1, line["n"], 0)

	buf.Reset()
	log, err = logger.New(&buf, "info", "TEXT")
	require.NoError(t, err)
	log.Info("hello", "n", 1)
	require.Contains(t, buf.String(), "msg=hello n=1")
}

func TestLevels(t *testing.T) {
	var buf bytes.Buffer
	log, err := logger.New(&buf, "warn", "text")
	require.NoError(t, err)
	log.Info("hidden")
	log.Warn("shown")
	require.NotContains(t, buf.String(), "hidden")
	require.Contains(t, buf.String(), "shown")

	buf.Reset()
	log, err = logger.New(&buf, "DEBUG", "text")
	require.NoError(t, err)
	log.Debug("shown")
	require.Contains(t, buf.String(), "shown")
}

func TestBadValues(t *testing.T) {
	for _, tc := range []struct{ level, format, want string }{
		{"loud", "json", `LOG_LEVEL="loud": use debug, info, warn or error`},
		{"", "json", `LOG_LEVEL=""`},
		{"info", "xml", `LOG_FORMAT="xml": use json or text`},
	} {
		_, err := logger.New(&bytes.Buffer{}, tc.level, tc.format)
		require.ErrorContains(t, err, tc.want)
		require.True(t, strings.HasPrefix(err.Error(), "bad configuration: "), err)
	}
}
