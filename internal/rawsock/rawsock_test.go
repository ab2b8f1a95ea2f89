package rawsock

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockagent/lockagent/internal/testkit/redistest"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unixPair returns both ends of a connected Unix stream socket, the first
// wrapped.
func unixPair(t *testing.T) (*Conn, *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	peer := <-accepted
	require.NotNil(t, peer)
	w, ok := Wrap(c).(*Conn)
	require.True(t, ok, "a Unix socket is wrapped")
	t.Cleanup(func() { w.Close(); peer.Close() })
	return w, peer
}

func TestReadWrite(t *testing.T) {
	c, peer := unixPair(t)
	n, err := c.Write([]byte("hello\n"))
	require.NoError(t, err)
	assert.Equal(t, 6, n)
	buf := make([]byte, 16)
	n, err = io.ReadFull(peer, buf[:6])
	require.NoError(t, err)
	assert.Equal(t, "hello\n", string(buf[:n]))

	// A read waits in the poller until the peer writes.
	go func() {
		time.Sleep(20 * time.Millisecond)
		peer.Write([]byte("late"))
	}()
	n, err = c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "late", string(buf[:n]))

	n, err = c.Read(nil)
	assert.NoError(t, err)
	assert.Zero(t, n)

	require.NoError(t, peer.Close())
	_, err = c.Read(buf)
	assert.ErrorIs(t, err, io.EOF, "the end of the stream")
}

func TestReadDeadline(t *testing.T) {
	c, _ := unixPair(t)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	start := time.Now()
	_, err := c.Read(make([]byte, 4))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne))
	assert.True(t, ne.Timeout(), "a timeout, as net.Conn's")
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

func TestClosed(t *testing.T) {
	c, _ := unixPair(t)
	require.NoError(t, c.Close())
	_, err := c.Read(make([]byte, 4))
	assert.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write([]byte("x"))
	assert.ErrorIs(t, err, net.ErrClosed)
}

// A write larger than the socket's buffer waits for the peer to read, by
// the write deadline.
func TestWriteAllWaits(t *testing.T) {
	c, peer := unixPair(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
		got <- b
	}()
	n, err := c.Write(big)
	require.NoError(t, err)
	assert.Equal(t, len(big), n)
	assert.Equal(t, big, <-got)

	// Nobody reads: the write fails at its deadline.
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	n, err = c.Write(big)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Less(t, n, len(big))
}

func TestWritev(t *testing.T) {
	c, peer := unixPair(t)
	var n int
	var errno syscall.Errno
	require.NoError(t, c.raw.Write(func(fd uintptr) bool {
		n, errno = Writev(fd, [][]byte{[]byte("a"), nil, []byte("bc"), {}, []byte("d\n")})
		return true
	}))
	require.Zero(t, errno)
	assert.Equal(t, 5, n)
	buf := make([]byte, 5)
	_, err := io.ReadFull(peer, buf)
	require.NoError(t, err)
	assert.Equal(t, "abcd\n", string(buf))

	require.NoError(t, c.raw.Write(func(fd uintptr) bool {
		n, errno = Writev(fd, [][]byte{nil, {}})
		return true
	}))
	assert.Zero(t, errno)
	assert.Zero(t, n, "nothing to write")
}

func TestWrapOther(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Same(t, a, Wrap(a), "a connection without a socket is itself")
}

// selfSigned returns a certificate for 127.0.0.1 and the pool that trusts
// it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "rawsock test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// echoOnce accepts one connection of ln and echoes a line back.
func echoOnce(ln net.Listener) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	buf := make([]byte, 64)
	n, _ := c.Read(buf)
	c.Write(buf[:n])
}

// requireEcho requires c, connected to echoOnce, to echo a line.
func requireEcho(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
}

func TestDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go echoOnce(ln)
	c, err := Dialer(time.Second, nil)(t.Context(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.IsType(t, &Conn{}, c)
	requireEcho(t, c)
}

// TLS runs over the wrapped socket, the server's name taken from the
// address when the config names none.
func TestDialerTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)
	defer ln.Close()
	go echoOnce(ln)
	cfg := &tls.Config{RootCAs: pool}
	c, err := Dialer(time.Second, cfg)(t.Context(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.Empty(t, cfg.ServerName, "the caller's config is not changed")
	tc, ok := c.(*tls.Conn)
	require.True(t, ok)
	assert.IsType(t, &Conn{}, tc.NetConn())
	requireEcho(t, c)

	// A server whose certificate does not match fails the handshake.
	go echoOnce(ln)
	_, err = Dialer(time.Second, &tls.Config{RootCAs: x509.NewCertPool()})(t.Context(), "tcp", ln.Addr().String())
	assert.ErrorContains(t, err, "certificate")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = Dialer(time.Second, nil)(ctx, "tcp", ln.Addr().String())
	assert.ErrorIs(t, err, context.Canceled)
}

// The socket offered to checks is peeked: f runs only when there is
// something to read.
func TestSyscallConnPeeks(t *testing.T) {
	c, peer := unixPair(t)
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	calls := 0
	check := func(fd uintptr) bool { calls++; return true }

	require.NoError(t, rc.Read(check))
	assert.Zero(t, calls, "nothing to read: f does not run")

	_, err = peer.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, rc.Read(check))
	assert.Equal(t, 1, calls, "data: f runs")
	_, err = c.Read(make([]byte, 1))
	require.NoError(t, err)

	require.NoError(t, peer.Close())
	require.NoError(t, rc.Read(check))
	assert.Equal(t, 2, calls, "the end: f runs")
}

// go-redis checks a pooled connection before each command through the
// socket Conn offers: one the server closed is dropped, and the command
// goes on a fresh one, with no retry to spend.
func TestGoRedisDropsClosedConnection(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Dialer: Dialer(time.Second, nil), MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	ctx := t.Context()
	require.NoError(t, c.Ping(ctx).Err())
	id, err := c.ClientID(ctx).Result()
	require.NoError(t, err)

	admin := srv.Client(t)
	require.NoError(t, admin.ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Err())
	require.Eventually(t, func() bool {
		list, err := admin.ClientList(ctx).Result()
		return err == nil && !strings.Contains(list, fmt.Sprintf("id=%d ", id))
	}, 5*time.Second, 5*time.Millisecond, "the server closed the connection")

	require.NoError(t, c.Ping(ctx).Err(), "the closed connection was dropped before the command")
	again, err := c.ClientID(ctx).Result()
	require.NoError(t, err)
	assert.NotEqual(t, id, again, "a fresh connection")
}
