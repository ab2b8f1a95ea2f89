package lockcheck

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckGrantOrder(t *testing.T) {
	ok := []Tenure{
		{Name: "a", Holder: "h1", Granted: 10, End: 12},
		{Name: "a", Holder: "h2", Granted: 13, End: 20},
		{Name: "a", Holder: "h3", Granted: 21}, // still held
		{Name: "b", Holder: "h4", Granted: 11, End: 30},
	}
	require.Empty(t, CheckGrantOrder(ok))

	lost := append(ok, Tenure{Name: "b", Holder: "h5", Granted: 25, End: 40})
	vs := CheckGrantOrder(lost)
	require.Len(t, vs, 1)
	require.Equal(t, "b", vs[0].Name)
	require.Contains(t, vs[0].Detail, "held until 30")

	never := []Tenure{{Name: "c", Holder: "old", Granted: 5}, {Name: "c", Holder: "new", Granted: 9, End: 10}}
	vs = CheckGrantOrder(never)
	require.Len(t, vs, 1)
	require.Contains(t, vs[0].Detail, "never ended in the store")
}
