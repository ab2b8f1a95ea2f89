package socketapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

func TestErrorCode(t *testing.T) {
	for err, want := range map[error]string{
		agent.ErrInvalidName:                       CodeInvalidName,
		agent.ErrInvalidArgument:                   CodeInvalidArgument,
		agent.ErrNotHeld:                           CodeNotHeld,
		&agent.AlreadyHeldError{}:                  CodeAlreadyHeld,
		agent.ErrPermissionDenied:                  CodePermissionDenied,
		agent.ErrLimitExceeded:                     CodeLimitExceeded,
		agent.ErrSessionExpired:                    CodeSessionExpired,
		agent.ErrShuttingDown:                      CodeShuttingDown,
		agent.ErrSessionEnded:                      CodeCanceled,
		context.Canceled:                           CodeCanceled,
		backend.ErrUnavailable:                     CodeBackendUnavailable,
		backend.ErrClosed:                          CodeBackendUnavailable,
		context.DeadlineExceeded:                   CodeBackendUnavailable,
		backend.ErrForeignKey:                      CodeForeignKey,
		errors.New("something else"):               CodeInternal,
		fmt.Errorf("x: %w", backend.ErrForeignKey): CodeForeignKey,
	} {
		got, known := errorCode(err)
		assert.Equal(t, want, got, "%v", err)
		assert.Equal(t, want != CodeInternal, known)
	}
}

func TestLineReader(t *testing.T) {
	lr := newLineReader(strings.NewReader("a\r\n\nbb\n"+strings.Repeat("x", 100)+"\nlast"), 100)
	for _, want := range []string{"a", "", "bb", strings.Repeat("x", 100)} {
		line, err := lr.readLine()
		require.NoError(t, err)
		assert.Equal(t, want, string(line))
	}
	_, err := lr.readLine()
	assert.ErrorIs(t, err, io.EOF, "a last line without a newline is not a request")
}

// TestLineReaderBounded: a line with no newline never makes the reader
// hold more than the limit.
func TestLineReaderBounded(t *testing.T) {
	lr := newLineReader(io.LimitReader(infinite{}, 10<<20), 64<<10)
	_, err := lr.readLine()
	assert.ErrorIs(t, err, errLineTooLong)
	assert.LessOrEqual(t, len(lr.buf), 64<<10+2)
}

// TestLineReaderShrinks: after a long line the buffer goes back to small.
func TestLineReaderShrinks(t *testing.T) {
	in := strings.Repeat("y", 60000) + "\n" + "short\n"
	lr := newLineReader(strings.NewReader(in), 64<<10)
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

func TestDuplicateKey(t *testing.T) {
	for line, want := range map[string]string{
		`{"a":1,"b":2}`:                   "",
		`{"a":1,"a":2}`:                   "a",
		`{"a":{"b":1,"b":2}}`:             "",
		`{"a":[{"a":1}],"b":"a\"","a":3}`: "a",
		`{"\u0061":1,"a":2}`:              "a",
		`{"s":"{\"s\":1}","t":1}`:         "",
	} {
		key, dup := duplicateKey([]byte(line))
		assert.Equal(t, want != "", dup, line)
		assert.Equal(t, want, key, line)
	}
}
