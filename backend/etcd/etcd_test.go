package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/backendtest"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// open returns a backend on endpoints under prefix, closed at the test's
// cleanup.
func open(t testing.TB, endpoints []string, prefix string) *etcd.Backend {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	b, err := etcd.Open(context.Background(), etcd.Options{Client: cli, KeyPrefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// conformance runs the suite on a cluster, each subtest under a key
// prefix of its own.
func conformance(t *testing.T, c *etcdtest.Cluster) {
	n := 0
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		n++
		return open(t, c.Endpoints(), fmt.Sprintf("t%d", n))
	})
}

// TestConformance: the etcd backend passes the suite the other backends
// pass, on one member.
func TestConformance(t *testing.T) {
	conformance(t, etcdtest.Start(t, etcdtest.Options{}))
}

// TestConformanceThreeMembers: the same on a cluster of three, whose
// client spreads its requests over the members.
func TestConformanceThreeMembers(t *testing.T) {
	conformance(t, etcdtest.Start(t, etcdtest.Options{Members: 3}))
}

// TestExhausted: a name whose offset leaves no token below MaxToken is
// refused, and what needs no new token goes on.
func TestExhausted(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	n := 0
	backendtest.RunExhausted(t, func(t *testing.T) (backend.Backend, func(string)) {
		n++
		prefix := fmt.Sprintf("x%d", n)
		return open(t, c.Endpoints(), prefix), func(name string) {
			key := fmt.Sprintf("%s/n/%s/f/%019d", prefix, strings.ReplaceAll(name, "/", "%2F"), uint64(backend.MaxToken))
			_, err := cli.Put(t.Context(), key, "")
			require.NoError(t, err)
		}
	})
}
