// Package handover is the conversation between a serving agent and the
// new process it hands itself over to (an upgrade): the messages, in
// order, the descriptors that go with them, and the version of the
// state's format. It knows the states it carries only as the packages that
// own them define them (agent, socketapi, memory).
//
// The conversation, on a Unix socket pair that the old process gives the
// new one as a descriptor:
//
//	new → old  Hello: its version, the state formats it reads, its settings;
//	           or why it cannot start
//	old → new  Accept: the format it will write; or Refuse, and the old goes on
//	new → old  Want: it has opened its backend, and takes the connections
//	           now; or why it cannot
//	old → new  Conns: the connections' ids, and their descriptors (the old
//	           one serves on)
//	new → old  Take: it has made its connections of them, and takes the
//	           state now; or why it cannot
//	old → new  State, and the descriptors it names (the old one is frozen)
//	new → old  Ready: it has restored everything; or Failed
//	old → new  Commit
//	new → old  Serving: its pid; it serves from now on
//
// The old process goes on as if nothing had happened when any step before
// Serving fails or times out: it kills the new process first, if Commit was
// sent. Once Serving is received it exits without another step.
package handover

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/socketapi"
)

// Format is the version of the state's format this release writes. A
// release reads its own format and the one before it, and writes either:
// an upgrade, and a downgrade, between neighbouring releases work.
const Format = 1

// Formats are the formats this release reads and writes: its own and
// the one before it (none is before the first).
var Formats = FormatsOf(Format)

// FormatsOf are the formats a release of format f reads and writes.
func FormatsOf(f int) []int {
	if f > 1 {
		return []int{f - 1, f}
	}
	return []int{f}
}

// Pick is the format of a state that a release writing the formats
// writes gives one reading reads: the newest of both; 0 if none.
func Pick(writes, reads []int) int {
	for _, f := range slices.Backward(reads) {
		if slices.Contains(writes, f) {
			return f
		}
	}
	return 0
}

// Env names the environment variable that tells a new process the
// descriptor of its side of the conversation.
const Env = "LOCKAGENT_HANDOVER_FD"

// Settings are what a handover cannot change: the new process's, which
// the old one compares with its own.
type Settings struct {
	Backend string `json:"backend"` // the backend and where it keeps its locks
	Socket  string `json:"socket"`
	Metrics string `json:"metrics,omitempty"` // its address, which may change
}

// Hello is the new process's first message. Failed, if set, says why it
// cannot take the agent over (its configuration is invalid, say), and ends
// the conversation.
type Hello struct {
	Version  string   `json:"version"`
	PID      int      `json:"pid"`
	Formats  []int    `json:"formats"`
	Settings Settings `json:"settings"`
	Failed   string   `json:"failed,omitempty"`
}

// Accept is the old process's answer to Hello: the format of the state it
// will send, or why it refuses.
type Accept struct {
	Format int    `json:"format,omitempty"`
	Refuse string `json:"refuse,omitempty"`
}

// Want says the new process takes the connections now; or, with Failed,
// why it cannot (its backend cannot be reached, say).
type Want struct {
	Failed string `json:"failed,omitempty"`
}

// Conns are the ids of the connections whose descriptors follow, taken
// while the old process serves: the work of taking them is done before
// the freeze (see socketapi.Server.Connections).
type Conns struct {
	IDs []uint64 `json:"ids"`
}

// Take says the new process has taken the connections, and takes the
// state now; or, with Failed, why it cannot.
type Take struct {
	Failed string `json:"failed,omitempty"`
}

// State is the agent's state, as the old process took it once frozen.
type State struct {
	Format int             `json:"format"`
	Mono   time.Duration   `json:"mono"`   // CLOCK_MONOTONIC when it was taken
	Frozen time.Duration   `json:"frozen"` // and when the agent froze, before
	Agent  agent.State     `json:"agent"`
	Server socketapi.State `json:"server"`
	Memory *memory.State   `json:"memory,omitempty"` // the embedded backend's
	Etcd   *etcd.State     `json:"etcd,omitempty"`   // the etcd backend's
	// StateLock is the descriptor of the state directory's lock file, -1
	// without one; Metrics, the metrics' listener, -1 without one.
	StateLock int `json:"state_lock"`
	Metrics   int `json:"metrics"`
	FDs       int `json:"fds"` // how many descriptors follow

	Upgrades Upgrades `json:"upgrades"`
}

// Upgrades counts the agent's upgrades, across its processes.
type Upgrades struct {
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
}

// Ready is the new process's answer to State: Failed says why it cannot
// go on, and the old process goes on.
type Ready struct {
	Failed string `json:"failed,omitempty"`
}

// Commit hands the agent over, from the process From.
type Commit struct {
	From int `json:"from"`
}

// Serving is the new process's last message.
type Serving struct {
	PID     int    `json:"pid"`
	Version string `json:"version"`
}

// Since is how long ago the state was taken, on CLOCK_MONOTONIC, which
// every process of the host reads alike.
func (st State) Since() time.Duration {
	return max(monotonic()-st.Mono, 0)
}

// Waited is how long ago the agent froze: how long its clients have
// waited.
func (st State) Waited() time.Duration {
	return max(monotonic()-st.Frozen, 0)
}

// Now is CLOCK_MONOTONIC now, for State.Mono and State.Frozen.
func Now() time.Duration { return monotonic() }

func monotonic() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// Conn is one side of the conversation.
type Conn struct {
	uc *net.UnixConn
}

// Pair makes the two sides: the old process keeps its Conn, and gives the
// new process the file, which it opens with Open.
func Pair() (*Conn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "handover")
	defer mine.Close()
	c, err := fileConn(mine)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, err
	}
	return c, os.NewFile(uintptr(fds[1]), "handover"), nil
}

// Open is the new process's side, from its descriptor fd.
func Open(fd int) (*Conn, error) {
	f := os.NewFile(uintptr(fd), "handover")
	defer f.Close()
	return fileConn(f)
}

func fileConn(f *os.File) (*Conn, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, errors.New("handover: not a Unix socket")
	}
	return &Conn{uc: uc}, nil
}

// Close ends the conversation.
func (c *Conn) Close() error { return c.uc.Close() }

// SetDeadline bounds the next sends and receives.
func (c *Conn) SetDeadline(t time.Time) error { return c.uc.SetDeadline(t) }

// maxMessage bounds a message: the state of the largest agent the limits
// allow is far below it.
const maxMessage = 1 << 30

// Send sends a message: its length, then its gob. Gob, not JSON: the
// state of 10,000 sessions takes a fifth of the time to encode and decode,
// while the agent is frozen, and is half the size; and a decoder matches
// fields by name, so that neighbouring releases read each other's
// messages. Each message is a gob stream of its own, and its length comes
// first, so that no decoder reads ahead into the descriptors that follow.
func (c *Conn) Send(m any) error {
	var buf bytes.Buffer
	buf.Write(make([]byte, 4))
	if err := gob.NewEncoder(&buf).Encode(m); err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	b := buf.Bytes()
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := c.uc.Write(b); err != nil {
		return fmt.Errorf("handover: send: %w", err)
	}
	return nil
}

// Recv receives a message into m.
func (c *Conn) Recv(m any) error {
	var n [4]byte
	if _, err := io.ReadFull(c.uc, n[:]); err != nil {
		return fmt.Errorf("handover: receive: %w", err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxMessage {
		return fmt.Errorf("handover: receive: a message of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c.uc, b); err != nil {
		return fmt.Errorf("handover: receive: %w", err)
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(m); err != nil {
		return fmt.Errorf("handover: receive: %w", err)
	}
	return nil
}

// fdBatch is how many descriptors one message carries; the kernel takes
// at most 253 (SCM_MAX_FD).
const fdBatch = 250

// SendFDs sends the descriptors, a batch at a time. They stay open here.
func (c *Conn) SendFDs(fds []int) error {
	for len(fds) > 0 {
		n := min(len(fds), fdBatch)
		if _, _, err := c.uc.WriteMsgUnix([]byte{byte(n)}, unix.UnixRights(fds[:n]...), nil); err != nil {
			return fmt.Errorf("handover: send descriptors: %w", err)
		}
		fds = fds[n:]
	}
	return nil
}

// RecvFDs receives n descriptors, as files.
func (c *Conn) RecvFDs(n int) ([]*os.File, error) {
	files := make([]*os.File, 0, n)
	oob := make([]byte, unix.CmsgSpace(fdBatch*4))
	for len(files) < n {
		var b [1]byte
		_, oobn, _, _, err := c.uc.ReadMsgUnix(b[:], oob)
		if err != nil {
			closeAll(files)
			return nil, fmt.Errorf("handover: receive descriptors: %w", err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			closeAll(files)
			return nil, fmt.Errorf("handover: receive descriptors: %w", err)
		}
		got := 0
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "handed over"))
				got++
			}
		}
		if got != int(b[0]) {
			closeAll(files)
			return nil, fmt.Errorf("handover: receive descriptors: %d of %d came", got, b[0])
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
