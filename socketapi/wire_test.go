package socketapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/internal/wire"
)

func TestErrorCode(t *testing.T) {
	for err, want := range map[error]string{
		agent.ErrInvalidName:                       wire.CodeInvalidName,
		agent.ErrInvalidArgument:                   wire.CodeInvalidArgument,
		agent.ErrNotHeld:                           wire.CodeNotHeld,
		&agent.AlreadyHeldError{}:                  wire.CodeAlreadyHeld,
		agent.ErrPermissionDenied:                  wire.CodePermissionDenied,
		agent.ErrLimitExceeded:                     wire.CodeLimitExceeded,
		agent.ErrSessionExpired:                    wire.CodeSessionExpired,
		agent.ErrShuttingDown:                      wire.CodeShuttingDown,
		agent.ErrSessionEnded:                      wire.CodeCanceled,
		context.Canceled:                           wire.CodeCanceled,
		backend.ErrUnavailable:                     wire.CodeBackendUnavailable,
		backend.ErrClosed:                          wire.CodeBackendUnavailable,
		context.DeadlineExceeded:                   wire.CodeBackendUnavailable,
		backend.ErrForeignKey:                      wire.CodeForeignKey,
		backend.ErrTokensExhausted:                 wire.CodeTokensExhausted,
		errors.New("something else"):               wire.CodeInternal,
		fmt.Errorf("x: %w", backend.ErrForeignKey): wire.CodeForeignKey,
	} {
		got, known := errorCode(err)
		assert.Equal(t, want, got, "%v", err)
		assert.Equal(t, want != wire.CodeInternal, known)
	}
}

func TestLineReader(t *testing.T) {
	lr := &lineReader{r: strings.NewReader("a\r\n\nbb\n" + strings.Repeat("x", 100) + "\nlast"), max: 100}
	for _, want := range []string{"a", "", "bb", strings.Repeat("x", 100)} {
		line, err := lr.readLine()
		require.NoError(t, err)
		assert.Equal(t, want, string(line))
	}
	_, err := lr.readLine()
	assert.ErrorIs(t, err, io.EOF, "a last line without a newline is not a request")
}

// TestLineReaderPieces: lines that arrive a byte at a time, "\r\n" split
// across reads included, come out whole; begun is called once per line
// that had to wait for more.
func TestLineReaderPieces(t *testing.T) {
	in := `{"id":"part","op":"ping"}` + "\r\n" + "bb\n" + "\n"
	begun := 0
	lr := &lineReader{r: iotest.OneByteReader(strings.NewReader(in)), max: 100, begun: func() { begun++ }}
	for _, want := range []string{`{"id":"part","op":"ping"}`, "bb", ""} {
		line, err := lr.readLine()
		require.NoError(t, err)
		assert.Equal(t, want, string(line))
	}
	_, err := lr.readLine()
	assert.ErrorIs(t, err, io.EOF)
	assert.Equal(t, 2, begun, "the two lines longer than a byte")
}

// TestLineReaderBounded: a line with no newline never makes the reader
// hold more than the limit.
func TestLineReaderBounded(t *testing.T) {
	lr := &lineReader{r: io.LimitReader(infinite{}, 10<<20), max: 64 << 10}
	_, err := lr.readLine()
	assert.ErrorIs(t, err, errLineTooLong)
	assert.LessOrEqual(t, len(lr.buf), 64<<10+2)
}

// TestLineReaderShrinks: after a long line the buffer goes back to small.
func TestLineReaderShrinks(t *testing.T) {
	in := strings.Repeat("y", 60000) + "\n" + "short\n"
	lr := &lineReader{r: strings.NewReader(in), max: 64 << 10}
	_, err := lr.readLine()
	require.NoError(t, err)
	line, err := lr.readLine()
	require.NoError(t, err)
	assert.Equal(t, "short", string(line))
	_, err = lr.readLine()
	assert.ErrorIs(t, err, io.EOF)
	assert.LessOrEqual(t, len(lr.buf), minReadBuf)
}

type infinite struct{}

func (infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

func TestDecodeRequest(t *testing.T) {
	for line, want := range map[string]string{
		`{"a":1,"b":2,"op":"ping"}`:                 "",
		` { "op" : "ping" , "id" : 7 } `:            "",
		`{"a":1,"a":2}`:                             "bad_request: key \"a\" appears twice",
		`{"a":{"b":1,"b":2}}`:                       "",
		`{"a":[{"a":1}],"b":"a\"","a":3}`:           "bad_request: key \"a\" appears twice",
		`{"\u0061":1,"a":2}`:                        "bad_request: key \"a\" appears twice",
		`{"s":"{\"s\":1}","t":1}`:                   "",
		`{"op":"ping"} x`:                           "bad_request: a request is one JSON object per line",
		`[{"op":"ping"}]`:                           "bad_request: a request is one JSON object per line",
		`{"op":1}`:                                  "invalid_argument: op must be a JSON string",
		`{"ttl_ms":1.0}`:                            "invalid_argument: ttl_ms must be a JSON integer in range",
		`{"wait_ms":99999999999999999999}`:          "invalid_argument: wait_ms must be a JSON integer in range",
		`{"all":"yes"}`:                             "invalid_argument: all must be a JSON boolean",
		`{"resume":[]}`:                             "invalid_argument: resume must be a JSON object {\"session\": string, \"token\": string}",
		`{"resume":{"session":1}}`:                  "invalid_argument: resume must be a JSON object {\"session\": string, \"token\": string}",
		`{"resume":{"token":null}}`:                 "invalid_argument: resume must be a JSON object {\"session\": string, \"token\": string}",
		`{"resume":{"token":"a","\u0074oken":"b"}}`: "invalid_argument: resume has the key \"token\" twice",
		`{"target":true}`:                           "invalid_argument: target must be a JSON string or integer",
		`{"target":1.5}`:                            "invalid_argument: target must be a JSON string or integer",
		`{"target":[1]}`:                            "invalid_argument: target must be a JSON string or integer",
		`{"name":null,"op":"ping"}`:                 "",
	} {
		var req request
		err := decodeRequest([]byte(line), &req)
		if want == "" {
			assert.Nil(t, err, line)
			continue
		}
		require.NotNil(t, err, line)
		assert.Equal(t, want, err.code+": "+err.msg, line)
	}

	// Nested too deep, in an unknown field: said so.
	deep := func(n int) string { return `{"op":"ping","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + "}" }
	var nested request
	assert.Nil(t, decodeRequest([]byte(deep(maxDepth-1)), &nested))
	err := decodeRequest([]byte(deep(maxDepth)), &nested)
	require.NotNil(t, err)
	assert.Equal(t, "bad_request: a request is one JSON object per line, with values nested at most 10000 deep", err.code+": "+err.msg)

	// Many keys, a duplicate among the last.
	var b strings.Builder
	b.WriteString(`{"op":"ping"`)
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&b, `,"k%d":1`, i)
	}
	var many request
	assert.Nil(t, decodeRequest([]byte(b.String()+"}"), &many))
	err = decodeRequest([]byte(b.String()+`,"k4999":2}`), &many)
	require.NotNil(t, err)
	assert.Equal(t, `key "k4999" appears twice`, err.msg)

	// resume's keys are matched exactly; others are skipped.
	for line, want := range map[string]wire.Resume{
		`{"resume":{"session":"s","token":"t","x":[1]}}`:   {Session: "s", Token: "t"},
		`{"resume":{"SESSION":"s","ToKeN":"t"}}`:           {},
		`{"resume":{ "token" : "t\u0041" , "session":""}}`: {Token: "tA"},
	} {
		var req request
		require.Nil(t, decodeRequest([]byte(line), &req), line)
		require.NotNil(t, req.Resume, line)
		assert.Equal(t, want, *req.Resume, line)
	}

	var req request
	require.Nil(t, decodeRequest([]byte(`{"id":"x","op":"acquire","name":"a\tb","mode":"shared","limit":3,"scope":"session","ttl_ms":1000,"wait_ms":-1,"meta":"m","lease":"l","all":true,"target":5,"version":1,"client":"c","session_ttl_ms":2,"heartbeat_ms":3,"resume":{"session":"s","token":"t"}}`), &req))
	assert.Equal(t, `"x"`, string(req.ID))
	assert.Equal(t, "acquire", req.Op)
	assert.Equal(t, "a\tb", *req.Name)
	assert.Equal(t, "shared", *req.Mode)
	assert.EqualValues(t, 3, *req.Limit)
	assert.Equal(t, "session", *req.Scope)
	assert.EqualValues(t, 1000, *req.TTLMs)
	assert.EqualValues(t, -1, *req.WaitMs)
	assert.Equal(t, "m", *req.Meta)
	assert.Equal(t, "l", *req.Lease)
	assert.True(t, *req.All)
	assert.Equal(t, "5", string(req.Target))
	assert.EqualValues(t, 1, *req.Version)
	assert.Equal(t, "c", *req.Client)
	assert.EqualValues(t, 2, *req.SessionTTLMs)
	assert.EqualValues(t, 3, *req.HeartbeatMs)
	assert.Equal(t, wire.Resume{Session: "s", Token: "t"}, *req.Resume)
}

// TestEncodeOKFastPath: results that write their own fields give the same
// JSON as reflection would.
func TestEncodeOKFastPath(t *testing.T) {
	for _, res := range []any{
		wire.Granted{Acquired: true, Lease: wire.Lease{ID: "l_1", Name: "a\"b", Mode: "shared", Scope: "session", Token: 1 << 52, TTLMs: 15000}},
		wire.ReleaseResult{Released: true},
		wire.PongResult{Pong: true},
	} {
		var fast, slow map[string]any
		require.NoError(t, json.Unmarshal(encodeOK(json.RawMessage(`"x"`), res), &fast))
		b, err := json.Marshal(res)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &slow))
		slow["id"], slow["ok"] = "x", true
		assert.Equal(t, slow, fast)
	}
}
