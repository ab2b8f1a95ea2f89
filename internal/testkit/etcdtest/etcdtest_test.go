package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCluster starts three members, puts a key, kills the leader, and
// finds the key through the others and on the restarted member.
func TestCluster(t *testing.T) {
	c := Start(t, Options{Members: 3})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := cli.Put(ctx, "k", "v")
	require.NoError(t, err)

	old := c.Leader(t)
	c.Member(old).Kill()
	require.NotEqual(t, old, c.Leader(t), "a new leader")
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)

	c.Member(old).Restart(t)
	one := NewClient(t, []string{c.Member(old).Addr()})
	resp, err = one.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}
