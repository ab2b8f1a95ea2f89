package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
)

// TestRestoreKeepsEtcdLeases: a backend that restores another's state (an
// agent's upgrade) renews that one's holders on the same etcd leases,
// past their TTL, with no read or move of a holder. Without the state, a
// new process read and moved each holder on its first renewal: thousands
// of round trips, which outlasted the renewals' deadline under load.
func TestRestoreKeepsEtcdLeases(t *testing.T) {
	const ttl = time.Second
	c := etcdtest.Start(t, etcdtest.Options{})
	raw := c.Client(t)
	ctx := t.Context()

	// The old process's backend, which exits without closing: its client
	// just ends.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	old, err := etcd.Open(ctx, etcd.Options{Client: cli, KeyPrefix: "up"})
	require.NoError(t, err)
	t.Cleanup(func() { old.Close() })
	var reqs []backend.RenewRequest
	for i := range 3 {
		req := backend.AcquireRequest{Name: fmt.Sprintf("up/%d", i), LeaseID: fmt.Sprintf("l%d", i), Mode: backend.Exclusive, TTL: ttl}
		if i == 2 {
			req.Mode = backend.Shared
		}
		_, err := old.Acquire(ctx, req)
		require.NoError(t, err)
		reqs = append(reqs, backend.RenewRequest{LeaseKey: backend.LeaseKey{Name: req.Name, LeaseID: req.LeaseID, Mode: req.Mode}, TTL: ttl})
	}
	before := holderLeases(t, raw, "up/")
	require.Len(t, before, 3)
	st := old.Snapshot(time.Now())
	require.NoError(t, cli.Close())

	b := open(t, c.Endpoints(), "up")
	require.NoError(t, b.Restore(st, 0))
	// Three TTLs of renewals, a third of a TTL apart.
	for range 9 {
		for i, err := range b.Renew(ctx, reqs) {
			require.NoError(t, err, "renewal of %s", reqs[i].Name)
		}
		time.Sleep(ttl / 3)
	}
	require.Equal(t, before, holderLeases(t, raw, "up/"), "the holders are on the etcd leases they were granted on")
}

// holderLeases returns the etcd lease of each key under prefix that has
// one: the holders'.
func holderLeases(t *testing.T, cli *clientv3.Client, prefix string) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	require.NoError(t, err)
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		if kv.Lease != 0 {
			out[string(kv.Key)] = kv.Lease
		}
	}
	return out
}
