package socketapi_test

// Clients of other uids and groups: the test binary runs itself again as a
// child process with other credentials (the tests run as root, which may
// set any uid and gid; no user is created), and the agent reads them with
// SO_PEERCRED like any peer's. Group membership by uid comes from the
// system's group database: the tests that need it add a group of their own
// with groupadd, listing the existing user daemon, and remove it after.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit/agentbin"
)

// peerEnv switches the test binary into a peer process (see peerMain).
const peerEnv = "LOCKAGENT_TEST_PEER"

// peerMain runs the test binary as a client of the agent at args[0]:
//
//	relay: connects, then copies its stdin to the connection and the
//	  connection to its stdout, until either ends; a failed connect
//	  prints {"dial_error": …} and exits 3.
//	conns N: opens N connections and pings on each; prints
//	  "accepted A refused R", then holds them until stdin ends.
//	slowloris N: opens N connections and trickles one byte of a request
//	  on each, every 50ms; prints "open N", then "closed N" once the agent
//	  has closed them all (exit 0), or exits 1 after 30s.
func peerMain(mode string, args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "peer: socket path missing")
		return 2
	}
	path := args[0]
	n := 0
	if len(args) > 1 {
		n, _ = strconv.Atoi(args[1])
	}
	var err error
	switch mode {
	case "relay":
		err = relay(path)
	case "conns":
		err = holdConns(path, n)
	case "slowloris":
		err = slowloris(path, n)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	return 0
}

func relay(path string) error {
	nc, err := net.Dial("unix", path)
	if err != nil {
		b, _ := json.Marshal(map[string]string{"dial_error": err.Error()})
		fmt.Printf("%s\n", b)
		os.Exit(3)
	}
	go func() {
		io.Copy(nc, os.Stdin)
		nc.Close()
	}()
	io.Copy(os.Stdout, nc)
	return nil
}

func holdConns(path string, n int) error {
	accepted, refused := 0, 0
	var conns []net.Conn
	for i := 0; i < n; i++ {
		nc, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		conns = append(conns, nc)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(nc, "{\"op\":\"ping\"}\n")
		line, err := bufio.NewReader(nc).ReadString('\n')
		switch {
		case strings.Contains(line, `"pong":true`):
			accepted++
		case strings.Contains(line, `"limit_exceeded"`):
			refused++
		default:
			return fmt.Errorf("connection %d: %q, %v", i, line, err)
		}
		nc.SetDeadline(time.Time{})
	}
	fmt.Printf("accepted %d refused %d\n", accepted, refused)
	io.Copy(io.Discard, os.Stdin)
	for _, nc := range conns {
		nc.Close()
	}
	return nil
}

func slowloris(path string, n int) error {
	var conns []net.Conn
	for i := 0; i < n; i++ {
		nc, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		defer nc.Close()
		conns = append(conns, nc)
	}
	fmt.Printf("open %d\n", n)
	request := []byte(`{"op":"ping","pad":"` + strings.Repeat("x", 4096))
	deadline := time.Now().Add(30 * time.Second)
	for off := 0; time.Now().Before(deadline); off = (off + 1) % len(request) {
		open := 0
		for _, nc := range conns {
			nc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := nc.Write(request[off : off+1]); err == nil {
				open++
			}
		}
		if open == 0 {
			fmt.Printf("closed %d\n", n)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("connections still open after 30s")
}

var (
	groupSeq    atomic.Int32
	peerBinOnce sync.Once
	peerBinPath string
	peerBinErr  error
)

// peerBinary is a copy of the test binary that every uid may run (the
// original's directory is private to root).
func peerBinary(t *testing.T) string {
	t.Helper()
	peerBinOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			peerBinErr = err
			return
		}
		dir, err := os.MkdirTemp("", "la-peer")
		if err != nil {
			peerBinErr = err
			return
		}
		peerBinPath = filepath.Join(dir, "peer")
		peerBinErr = copyFile(self, peerBinPath)
		if peerBinErr == nil {
			peerBinErr = os.Chmod(dir, 0o755)
		}
	})
	require.NoError(t, peerBinErr)
	return peerBinPath
}

func removePeerBinary() {
	if peerBinPath != "" {
		os.RemoveAll(filepath.Dir(peerBinPath))
	}
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// cred is who a peer process runs as: uid, primary gid and supplementary
// groups (none unless listed).
type cred struct {
	uid, gid uint32
	groups   []uint32
}

// peerProc is a peer process; for relay, send and recv speak to the agent
// through it.
type peerProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *os.File
	r     *bufio.Reader
	err   *strings.Builder
}

// startPeer runs the test binary as a peer with credentials c.
func startPeer(t *testing.T, c cred, mode, path string, args ...string) *peerProc {
	t.Helper()
	cmd := exec.Command(peerBinary(t), append([]string{path}, args...)...)
	cmd.Env = agentbin.Env(t.TempDir(), peerEnv+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.gid, Groups: c.groups}}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout = outW
	p := &peerProc{t: t, cmd: cmd, stdin: stdin, out: outR, r: bufio.NewReader(outR), err: new(strings.Builder)}
	cmd.Stderr = p.err
	require.NoError(t, cmd.Start())
	outW.Close()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		outR.Close()
		if t.Failed() && p.err.Len() > 0 {
			t.Logf("peer %s (uid %d) stderr:\n%s", mode, c.uid, p.err.String())
		}
	})
	return p
}

// line reads the peer's next line of output, failing after 10s.
func (p *peerProc) line() string {
	p.t.Helper()
	p.out.SetReadDeadline(time.Now().Add(10 * time.Second))
	s, err := p.r.ReadString('\n')
	require.NoError(p.t, err, "reading from the peer; stderr: %s", p.err)
	return strings.TrimSuffix(s, "\n")
}

// call sends a request through a relay and returns the answer.
func (p *peerProc) call(line string) map[string]any {
	p.t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(p.t, err)
	var m map[string]any
	out := p.line()
	require.NoError(p.t, json.Unmarshal([]byte(out), &m), "line %q", out)
	return m
}

// requireClosed requires the relay's connection to end: its output ends.
func (p *peerProc) requireClosed() {
	p.t.Helper()
	p.out.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, err := p.r.ReadString('\n')
		if err != nil {
			require.ErrorIs(p.t, err, io.EOF, "the connection stayed open")
			return
		}
	}
}

// testGroup adds a group listing the user daemon for the test's length and
// returns its gid: membership that only the group database knows of.
func testGroup(t *testing.T) uint32 {
	t.Helper()
	name := fmt.Sprintf("lat%d-%d", os.Getpid()%1000000, groupSeq.Add(1))
	if out, err := exec.Command("groupadd", "-U", "daemon", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
			t.Errorf("groupdel: %v: %s", err, out)
		}
	})
	g, err := user.LookupGroup(name)
	require.NoError(t, err)
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	require.NoError(t, err)
	return uint32(gid)
}
