package balance

import (
	"cmp"
	"slices"
	"sort"

	"github.com/flotilla-dev/flotilla/bucket"
)

// Node is a live node as the assignment sees it.
type Node struct {
	ID       string
	Declared bucket.Set
	// Balance is false for a node that opted out of balancing, or whose
	// version predates it: it holds what it can, is given only what an
	// operator pins to it, and gives away only what is pinned elsewhere.
	Balance bool
}

// Input is what every node reads from the store to compute the assignment.
type Input struct {
	// Buckets is the fleet's bucket count.
	Buckets int
	// Nodes are the live nodes that are not leaving, in any order; a node
	// id given twice counts once.
	Nodes []Node
	// Holders names, by node id, who holds each held bucket now: for a
	// bucket whose holder is handing it over, its successor. A holder that
	// is not in Nodes counts as nobody.
	Holders map[int]string
	// Pins are the operators' moves (`worker buckets move`): bucket to
	// node id. A pin to a node that is not live, or does not declare the
	// bucket, is ignored until it does.
	Pins map[int]string
}

// Assignment is the target holder of every bucket.
type Assignment struct {
	targets []string
}

// Target returns the node that should hold bucket b: "" when no node in
// particular should (no balancing node declares it), or b is not a bucket
// of the fleet.
func (a Assignment) Target(b int) string {
	if b < 0 || b >= len(a.targets) {
		return ""
	}
	return a.targets[b]
}

// Of returns the buckets whose target is node id.
func (a Assignment) Of(id string) bucket.Set {
	var bs []int
	for b, t := range a.targets {
		if t == id {
			bs = append(bs, b)
		}
	}
	return bucket.Of(bs...)
}

// Shares counts the buckets targeted to each node: its share of the fleet.
func (a Assignment) Shares() map[string]int {
	out := map[string]int{}
	for _, t := range a.targets {
		if t != "" {
			out[t]++
		}
	}
	return out
}

// Assign computes the target holder of every bucket (see the package
// documentation for the rules). It is deterministic: the same input, in
// any order, gives the same assignment.
func Assign(in Input) Assignment {
	p := newProblem(in)
	p.place()
	p.improve()
	return Assignment{targets: p.targets()}
}

// problem is one assignment under way. Buckets that balance may move
// ("movable") are grouped in intervals: runs of consecutive buckets that
// the same balancing nodes declare, so that a fleet of many buckets with a
// few declarations is a few intervals.
type problem struct {
	n     int
	nodes []Node // sorted by id
	fixed []string
	// owner is the node index a movable bucket is assigned to (-1 while
	// unplaced); ivOf its interval; both -1 for a bucket that is not
	// movable.
	owner []int32
	ivOf  []int32
	// held is the owner a movable bucket had on input: a move away from
	// it is a hand-off, a move back to it undoes one.
	held []int32
	ivs  []interval
	load []int
	// own counts, per node and interval, the movable buckets assigned;
	// owned lists them per node, ascending.
	own   [][]int
	owned [][]int
	// unplaced are the movable buckets nobody (eligible) holds, ascending.
	unplaced []int
}

// interval is a run [lo, hi) of buckets declared by the same balancing
// nodes.
type interval struct {
	lo, hi   int
	eligible []int // node indexes, ascending
	member   []bool
}

func newProblem(in Input) *problem {
	nodes := slices.Clone(in.Nodes)
	slices.SortStableFunc(nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	nodes = slices.CompactFunc(nodes, func(a, b Node) bool { return a.ID == b.ID })
	p := &problem{
		n: max(in.Buckets, 0), nodes: nodes,
		load: make([]int, len(nodes)), own: make([][]int, len(nodes)), owned: make([][]int, len(nodes)),
	}
	p.fixed = make([]string, p.n)
	p.owner = make([]int32, p.n)
	p.ivOf = make([]int32, p.n)
	p.held = make([]int32, p.n)
	index := make(map[string]int, len(nodes))
	for i, nd := range nodes {
		index[nd.ID] = i
	}
	p.ivs = p.intervals()
	for i := range p.own {
		p.own[i] = make([]int, len(p.ivs))
	}

	iv := 0
	for b := 0; b < p.n; b++ {
		p.owner[b], p.ivOf[b], p.held[b] = -1, -1, -1
		for iv < len(p.ivs) && p.ivs[iv].hi <= b {
			iv++
		}
		if pin, ok := in.Pins[b]; ok {
			if i, live := index[pin]; live && nodes[i].Declared.Contains(b) {
				p.fixed[b] = pin
				if nodes[i].Balance {
					p.load[i]++ // a pinned bucket counts against its node's share
				}
				continue
			}
		}
		h, live := index[in.Holders[b]]
		if live && !nodes[h].Balance && nodes[h].Declared.Contains(b) {
			p.fixed[b] = nodes[h].ID
			continue
		}
		if iv >= len(p.ivs) || len(p.ivs[iv].eligible) == 0 {
			continue // no balancing node declares it
		}
		p.ivOf[b] = int32(iv)
		if live && p.ivs[iv].member[h] {
			p.assign(b, h)
			p.held[b] = int32(h)
		} else {
			p.unplaced = append(p.unplaced, b)
		}
	}
	return p
}

// intervals splits the buckets at every bound of a balancing node's
// declaration.
func (p *problem) intervals() []interval {
	cuts := []int{0, p.n}
	for _, nd := range p.nodes {
		if !nd.Balance {
			continue
		}
		for lo, hi := range nd.Declared.Ranges() {
			cuts = append(cuts, min(lo, p.n), min(hi+1, p.n))
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []interval
	for i := 0; i+1 < len(cuts); i++ {
		iv := interval{lo: cuts[i], hi: cuts[i+1], member: make([]bool, len(p.nodes))}
		for j, nd := range p.nodes {
			if nd.Balance && nd.Declared.Contains(iv.lo) {
				iv.eligible = append(iv.eligible, j)
				iv.member[j] = true
			}
		}
		out = append(out, iv)
	}
	return out
}

func (p *problem) assign(b, i int) {
	p.owner[b] = int32(i)
	p.load[i]++
	p.own[i][p.ivOf[b]]++
	at, _ := slices.BinarySearch(p.owned[i], b)
	p.owned[i] = slices.Insert(p.owned[i], at, b)
}

func (p *problem) move(b, to int) {
	from := int(p.owner[b])
	p.load[from]--
	p.own[from][p.ivOf[b]]--
	if at, found := slices.BinarySearch(p.owned[from], b); found {
		p.owned[from] = slices.Delete(p.owned[from], at, at+1)
	}
	p.assign(b, to)
}

// place gives each unplaced bucket to the least loaded node that declares
// it, in runs: while the node that took the bucket before it may take it
// and is under an even share of the movable buckets, it does, so that a
// node starting with nothing gets a range rather than every n-th bucket (a
// claim reads the rows between the lowest and highest bucket it holds).
func (p *problem) place() {
	balancing := 0
	movable := 0
	for i, nd := range p.nodes {
		if nd.Balance {
			balancing++
			movable += p.load[i]
		}
	}
	movable += len(p.unplaced)
	if balancing == 0 {
		return
	}
	even := (movable + balancing - 1) / balancing
	last := -1
	for _, b := range p.unplaced {
		iv := p.ivs[p.ivOf[b]]
		if last >= 0 && iv.member[last] && p.load[last] < even {
			p.assign(b, last)
			continue
		}
		best := iv.eligible[0]
		for _, i := range iv.eligible[1:] {
			if p.load[i] < p.load[best] {
				best = i
			}
		}
		p.assign(b, best)
		last = best
	}
}

// improve moves buckets along chains from a node to one holding two or
// more fewer until there is no such chain: the assignment is then an
// optimal semi-matching. Each round takes the shortest chain any node has
// (a direct move as soon as one is found), from the most loaded node to
// the least loaded at that distance, so that balance costs as few
// hand-offs as it can.
func (p *problem) improve() {
	for {
		order := make([]int, 0, len(p.nodes))
		least := -1
		for i, nd := range p.nodes {
			if nd.Balance {
				order = append(order, i)
				if least < 0 || p.load[i] < least {
					least = p.load[i]
				}
			}
		}
		sort.SliceStable(order, func(a, b int) bool { return p.load[order[a]] > p.load[order[b]] })
		var best []step
		for _, u := range order {
			if p.load[u] < least+2 {
				break
			}
			if path := p.chain(u); path != nil && (best == nil || len(path) < len(best)) {
				best = path
				if len(best) == 1 {
					break
				}
			}
		}
		if best == nil {
			return
		}
		p.shift(best)
	}
}

// step is one edge of a chain: a bucket of interval iv moves from node
// from to node to.
type step struct{ from, to, iv int }

// chain finds a shortest chain from u to a node holding at least two fewer
// buckets, or nil.
func (p *problem) chain(u int) []step {
	parent := make([]step, len(p.nodes))
	seen := make([]bool, len(p.nodes))
	seen[u] = true
	level := []int{u}
	for len(level) > 0 {
		var next []int
		for _, x := range level {
			for iv := range p.ivs {
				if p.own[x][iv] == 0 {
					continue
				}
				for _, y := range p.ivs[iv].eligible {
					if !seen[y] {
						seen[y] = true
						parent[y] = step{from: x, to: y, iv: iv}
						next = append(next, y)
					}
				}
			}
		}
		best := -1
		for _, y := range next {
			if p.load[y] <= p.load[u]-2 && (best < 0 || p.load[y] < p.load[best] ||
				p.load[y] == p.load[best] && y < best) {
				best = y
			}
		}
		if best >= 0 {
			var path []step
			for y := best; y != u; y = parent[y].from {
				path = append(path, parent[y])
			}
			slices.Reverse(path)
			return path
		}
		level = next
	}
	return nil
}

// shift moves buckets along path. A chain of one step moves as many
// buckets as even the two nodes out, but never leaves the giver below the
// next most loaded node, which would give in its turn; a longer chain moves
// one bucket per step.
func (p *problem) shift(path []step) {
	count := 1
	if len(path) == 1 {
		s := path[0]
		next := 0
		for i, nd := range p.nodes {
			if nd.Balance && i != s.from {
				next = max(next, p.load[i])
			}
		}
		count = min((p.load[s.from]-p.load[s.to])/2, p.own[s.from][s.iv], max(1, p.load[s.from]-next))
	}
	for _, s := range path {
		for _, b := range p.pick(s, count) {
			p.move(b, s.to)
		}
	}
}

// pick chooses count buckets of interval s.iv that s.from holds, to give
// to s.to: first those whose move is no hand-off (placed here, not held),
// then those nearest to what s.to holds, or, when it holds nothing, the
// highest, so that both nodes keep ranges as far as they can.
func (p *problem) pick(s step, count int) []int {
	iv := p.ivs[s.iv]
	from, to := p.owned[s.from], p.owned[s.to]
	lo, _ := slices.BinarySearch(from, iv.lo)
	hi, _ := slices.BinarySearch(from, iv.hi)
	cands := slices.Clone(from[lo:hi])
	// dist is the distance from b to the nearest bucket s.to holds.
	const far = int(^uint(0) >> 1)
	dist := func(b int) int {
		at, _ := slices.BinarySearch(to, b)
		d := far
		if at < len(to) {
			d = to[at] - b
		}
		if at > 0 {
			d = min(d, b-to[at-1])
		}
		return d
	}
	cost := func(b int) int {
		switch int(p.held[b]) {
		case s.from:
			return 1
		case s.to:
			return -1
		}
		return 0
	}
	type cand struct{ b, cost, dist int }
	cs := make([]cand, len(cands))
	for i, b := range cands {
		cs[i] = cand{b, cost(b), dist(b)}
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if c := cmp.Compare(a.cost, b.cost); c != 0 {
			return c
		}
		if c := cmp.Compare(a.dist, b.dist); c != 0 {
			return c
		}
		return cmp.Compare(b.b, a.b) // the higher first
	})
	out := make([]int, 0, min(count, len(cs)))
	for _, c := range cs[:min(count, len(cs))] {
		out = append(out, c.b)
	}
	return out
}

func (p *problem) targets() []string {
	out := make([]string, p.n)
	for b := range out {
		switch {
		case p.fixed[b] != "":
			out[b] = p.fixed[b]
		case p.owner[b] >= 0:
			out[b] = p.nodes[p.owner[b]].ID
		}
	}
	return out
}
