package socketapi_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/socketapi"
)

// adoptedPeer hands one connection over to a new server as a handover
// does, with what it had queued, and returns the server, what the agent
// finds the session's connection with, and the peer's end.
func adoptedPeer(t *testing.T, queued string) (*socketapi.Server, agent.Conn, *bufio.Reader) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	peerFile := os.NewFile(uintptr(fds[1]), "peer")
	peer, err := net.FileConn(peerFile)
	peerFile.Close()
	require.NoError(t, err)
	t.Cleanup(func() { peer.Close() })
	srv := &socketapi.Server{}
	st := socketapi.State{Conns: []socketapi.ConnState{{ID: 7, FD: 0, Session: "s_a", Output: [][]byte{[]byte(queued)}}}}
	connOf, err := srv.Adopt(st, []*os.File{os.NewFile(uintptr(fds[0]), "adopted")})
	require.NoError(t, err)
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	return srv, connOf("s_a"), bufio.NewReader(peer)
}

// serve runs the server with a fresh agent until the test ends.
func serve(t *testing.T, srv *socketapi.Server) {
	t.Helper()
	dir := t.TempDir()
	b, err := memory.Open(filepath.Join(dir, "state"))
	require.NoError(t, err)
	a := agent.New(agent.Config{Backend: b})
	srv.Agent = a
	ln, err := socketapi.Listen(filepath.Join(dir, "s"), 0o600, "")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { a.Run(ctx); done <- struct{}{} }()
	go func() { srv.Serve(ctx, ln); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		b.Close()
	})
}

// TestAdoptedQueueComesFirst: what an adopted connection had queued in the
// old process is written before whatever the restored agent sends it
// before the server serves.
func TestAdoptedQueueComesFirst(t *testing.T) {
	srv, c, peer := adoptedPeer(t, `{"id":1,"ok":true}`+"\n")
	c.Send(agent.Event{Kind: agent.EventShutdown, Message: "later"})
	serve(t, srv)
	first, err := peer.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, `{"id":1,"ok":true}`+"\n", first)
	second, err := peer.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, second, `"later"`)
}

// TestAdoptedClosedBeforeServe: the restored agent may close an adopted
// connection before the server serves (it stops at once, say): the peer
// gets what was queued, then the end, and nothing panics.
func TestAdoptedClosedBeforeServe(t *testing.T) {
	srv, c, peer := adoptedPeer(t, `{"id":1,"ok":true}`+"\n")
	c.Close()
	serve(t, srv)
	first, err := peer.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, `{"id":1,"ok":true}`+"\n", first)
	_, err = peer.ReadString('\n')
	require.ErrorIs(t, err, io.EOF)
}
