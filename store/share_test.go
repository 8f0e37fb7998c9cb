package store_test

import (
	"fmt"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
)

// fairShare is store.FairShare of holder me of demands, the holders named
// h0, h1, ... in the order given (which is their order by owner).
func fairShare(n int, demands []int, me int) int {
	byOwner := make(map[string]int, len(demands))
	for i, d := range demands {
		byOwner[fmt.Sprintf("h%d", i)] = d
	}
	return store.FairShare(n, byOwner, fmt.Sprintf("h%d", me))
}

func TestFairShare(t *testing.T) {
	for _, c := range []struct {
		name    string
		n       int
		demands []int
		me      int
		want    int
	}{
		{"alone, wanting less", 4, []int{3}, 0, 3},
		{"alone, wanting more", 4, []int{9}, 0, 4},
		{"equal split", 4, []int{4, 4}, 0, 2},
		{"equal split of three", 6, []int{4, 4, 4}, 2, 2},
		// What a small holder leaves is split among the others: 7 - 1 = 6
		// over two is 3 each.
		{"a small holder leaves the rest", 7, []int{1, 4, 4}, 1, 3},
		{"the small holder gets its demand", 7, []int{1, 4, 4}, 0, 1},
		{"small holders leave enough for all", 8, []int{1, 2, 3}, 2, 3},
		{"a large holder takes what the others leave", 8, []int{1, 2, 9}, 2, 5},
		// What does not split evenly at the level goes to its first
		// holders by owner, one each, so that the fair shares add up to n.
		{"the remainder goes to the first by owner", 5, []int{4, 4}, 0, 3},
		{"and not to the next", 5, []int{4, 4}, 1, 2},
		{"remainder after a small holder", 6, []int{1, 9, 9}, 1, 3},
		{"remainder after a small holder, the next", 6, []int{1, 9, 9}, 2, 2},
		{"two of three get the remainder", 5, []int{2, 2, 2}, 1, 2},
		{"the third does not", 5, []int{2, 2, 2}, 2, 1},
		{"four over three: none left with nothing", 4, []int{4, 4, 4}, 2, 1},
		{"demand 0 gets nothing", 4, []int{0, 4}, 0, 0},
		{"demand 0 takes nothing from the others", 4, []int{0, 4}, 1, 4},
		{"all demands 0", 4, []int{0, 0, 0}, 1, 0},
		{"me past the end", 4, []int{1, 2}, 2, 0},
		{"me negative", 4, []int{1, 2}, -1, 0},
		{"no holders", 4, nil, 0, 0},
		{"n 0", 0, []int{3, 3}, 0, 0},
		{"n negative", -4, []int{3}, 0, 0},
		{"n negative, two holders", -3, []int{3, 3}, 1, 0},
	} {
		if got := fairShare(c.n, c.demands, c.me); got != c.want {
			t.Errorf("%s: FairShare(%d, %v, %d) = %d, want %d", c.name, c.n, c.demands, c.me, got, c.want)
		}
	}
}

func TestGrantShare(t *testing.T) {
	for _, c := range []struct {
		name            string
		n, fair, others int
		want            int
	}{
		{"the fair share when the others leave room", 4, 2, 1, 2},
		{"alone", 4, 4, 0, 4},
		{"only what the others leave", 4, 3, 2, 2},
		{"nothing left", 4, 2, 4, 0},
		// The others can hold more than n once the limit shrinks, or by
		// running rows counted past a lapsed share.
		{"never negative", 4, 2, 6, 0},
		{"fair 0", 4, 0, 0, 0},
		{"n 0", 0, 2, 0, 0},
	} {
		if got := store.GrantShare(c.n, c.fair, c.others); got != c.want {
			t.Errorf("%s: GrantShare(%d, %d, %d) = %d, want %d", c.name, c.n, c.fair, c.others, got, c.want)
		}
	}
	for n := 0; n <= 8; n++ {
		for fair := 0; fair <= 9; fair++ {
			for others := 0; others <= 12; others++ {
				g := store.GrantShare(n, fair, others)
				if g < 0 || g > fair || g+others > n && g > 0 {
					t.Fatalf("GrantShare(%d, %d, %d) = %d: want 0 <= grant <= fair and grant + others <= n", n, fair, others, g)
				}
				// It grants all it may: never less than both bounds.
				if g < min(fair, n-others) {
					t.Fatalf("GrantShare(%d, %d, %d) = %d, less than it may", n, fair, others, g)
				}
			}
		}
	}
}

// TestFairShareOverAGrid checks every demand vector of up to 4 holders
// (demands 0..9) for n in 0..8 against a split that hands out one slot per
// holder per round: a holder's fair share lies between what that split
// gives it when served last in every round and when served first; and the
// fair shares add up to exactly what may run.
func TestFairShareOverAGrid(t *testing.T) {
	var demands []int
	var walk func(holders int)
	check := func() {
		for n := 0; n <= 8; n++ {
			fair := make([]int, len(demands))
			for i, d := range demands {
				fair[i] = fairShare(n, demands, i)
				lo, hi := roundRobin(n, demands, i, false), roundRobin(n, demands, i, true)
				if fair[i] < 0 || fair[i] > d || fair[i] > max(n, 0) || fair[i] < lo || fair[i] > hi {
					t.Fatalf("FairShare(%d, %v, %d) = %d, want within demand %d and n, between %d and %d",
						n, demands, i, fair[i], d, lo, hi)
				}
				// The equal floor: never less than n over the holders,
				// unless it wants less.
				if k := len(demands); n > 0 && fair[i] < min(d, n/k) {
					t.Fatalf("FairShare(%d, %v, %d) = %d, below the floor %d", n, demands, i, fair[i], min(d, n/k))
				}
			}
			// The fair shares add up to what may run: n, or all that is
			// wanted when that is less.
			sumFair, sumDemand := 0, 0
			for i, f := range fair {
				sumFair, sumDemand = sumFair+f, sumDemand+demands[i]
			}
			if sumFair != min(max(n, 0), sumDemand) {
				t.Fatalf("n %d, demands %v: fair shares %v sum to %d, want %d", n, demands, fair, sumFair, min(max(n, 0), sumDemand))
			}
			// Renewals serialised through GrantShare, each holder counting
			// the others at their shares, never sum past n.
			shares := make([]int, len(demands))
			for round := range 3 {
				for i := range demands {
					others := 0
					for j, s := range shares {
						if j != i {
							others += s
						}
					}
					shares[i] = store.GrantShare(n, fair[i], others)
					if sum := others + shares[i]; sum > max(n, 0) {
						t.Fatalf("n %d, demands %v: round %d, holder %d: shares %v sum to %d", n, demands, round, i, shares, sum)
					}
				}
			}
		}
	}
	walk = func(holders int) {
		check()
		if holders == 4 {
			return
		}
		for d := 0; d <= 9; d++ {
			demands = append(demands, d)
			walk(holders + 1)
			demands = demands[:len(demands)-1]
		}
	}
	walk(0)
}

// roundRobin splits n by handing one slot per round to each holder that
// still wants one, holder me (an index of demands) first or last in every
// round, and returns me's part.
func roundRobin(n int, demands []int, me int, first bool) int {
	got := make([]int, len(demands))
	order := make([]int, 0, len(demands))
	if first {
		order = append(order, me)
	}
	for i := range demands {
		if i != me {
			order = append(order, i)
		}
	}
	if !first {
		order = append(order, me)
	}
	for left := n; left > 0; {
		gave := false
		for _, i := range order {
			if left > 0 && got[i] < demands[i] {
				got[i]++
				left--
				gave = true
			}
		}
		if !gave {
			break
		}
	}
	return got[me]
}
