package lockcheck

import (
	"cmp"
	"fmt"
	"slices"
)

// Tenure is one exclusive grant as the store itself recorded it, in the
// store's own order: Granted is the position of the grant (its fencing
// token, which is the store's order: etcd's revision, or Redis's clock in
// microseconds), End the position at which the store ended it (a
// release, an expiry), 0 if the store never did (its record was lost, or
// it still holds).
type Tenure struct {
	Name    string
	Holder  string
	Granted uint64
	End     uint64
}

// CheckGrantOrder checks, without excuses, that no two holders of an
// exclusive name overlap in the store's own order: each grant of a name
// comes after the end of the one before it. A failover that loses a
// grant breaks it, whatever the holders were told: the grant lost never
// ended, and the name was granted again. The last tenure of a name may
// be open.
func CheckGrantOrder(tenures []Tenure) []Violation {
	byName := map[string][]Tenure{}
	for _, t := range tenures {
		byName[t.Name] = append(byName[t.Name], t)
	}
	var out []Violation
	for name, ts := range byName {
		slices.SortFunc(ts, func(a, b Tenure) int { return cmp.Compare(a.Granted, b.Granted) })
		for i := 1; i < len(ts); i++ {
			prev, t := ts[i-1], ts[i]
			switch {
			case t.Granted == prev.Granted:
				out = append(out, Violation{Name: name, Check: "grant-order", At: int64(t.Granted),
					Detail: fmt.Sprintf("%s and %s were granted at the same position %d", prev.Holder, t.Holder, t.Granted)})
			case prev.End == 0:
				out = append(out, Violation{Name: name, Check: "grant-order", At: int64(t.Granted),
					Detail: fmt.Sprintf("%s granted at %d while %s, granted at %d, never ended in the store", t.Holder, t.Granted, prev.Holder, prev.Granted)})
			case prev.End > t.Granted:
				out = append(out, Violation{Name: name, Check: "grant-order", At: int64(t.Granted),
					Detail: fmt.Sprintf("%s granted at %d while %s, granted at %d, held until %d", t.Holder, t.Granted, prev.Holder, prev.Granted, prev.End)})
			}
		}
	}
	sortViolations(out)
	return out
}
