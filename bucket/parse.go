package bucket

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode"
)

// parsedElement is one element of a set spec, kept with its text and
// position so that an overlap can name both elements involved.
type parsedElement struct {
	span
	token    string
	position int // 1-based, among the comma-separated elements
}

// ParseSet parses a bucket set such as "0-31,40,42-45" for a fleet with
// count buckets.
//
// The spec is a comma-separated list of elements, each a bucket number ("40")
// or an inclusive range ("0-31"), with optional whitespace around each
// element. Elements may come in any order; they may not overlap or repeat,
// since that is almost always a typing mistake in an ownership list.
//
// A count of 0 means the fleet's bucket count is not known yet: the spec is
// then checked for everything except the upper bound, which [Set.CheckRange]
// checks once the count is known. Numbers that are not a bucket in any fleet
// (MaxCount and above) are refused even then.
//
// Every refusal is a *[SetError] or, for a bucket beyond the fleet's count, a
// *[RangeError]; both match [ErrInvalidSet] and name the offending element. A
// count outside 0..MaxCount gives an error matching [ErrInvalidCount].
func ParseSet(spec string, count int) (Set, error) {
	if count != 0 {
		if err := checkCount(count); err != nil {
			return Set{}, err
		}
	}
	if strings.TrimSpace(spec) == "" {
		return Set{}, &SetError{Spec: spec, Reason: "bucket set is empty"}
	}
	// Buckets must lie below limit: the fleet's count when known, and
	// otherwise the largest count any fleet may have.
	limit := count
	if limit == 0 {
		limit = MaxCount
	}

	rawElements := strings.Split(spec, ",")
	elements := make([]parsedElement, 0, len(rawElements))
	for i, raw := range rawElements {
		position := i + 1
		token := strings.TrimSpace(raw)
		if token == "" {
			return Set{}, &SetError{Spec: spec, Reason: emptyElementReason(position, len(rawElements))}
		}
		r, reason := parseElement(token)
		if reason != "" {
			return Set{}, &SetError{Spec: spec, Token: token, Reason: reason}
		}
		if r.hi >= limit {
			return Set{}, &RangeError{Spec: spec, Token: token, Bucket: max(r.lo, limit), Count: count}
		}
		elements = append(elements, parsedElement{span: r, token: token, position: position})
	}

	slices.SortFunc(elements, func(a, b parsedElement) int {
		return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.position, b.position))
	})
	// In start order, an element overlaps an earlier one exactly when it
	// starts at or before the furthest end reached so far.
	var spans []span
	furthest := elements[0]
	for _, e := range elements[1:] {
		if e.lo <= furthest.hi {
			return Set{}, overlapError(spec, furthest, e)
		}
		if e.hi > furthest.hi {
			furthest = e
		}
	}
	for _, e := range elements {
		spans = appendSpan(spans, e.span)
	}
	return Set{spans: spans}, nil
}

// emptyElementReason says where an empty element is, and the likely slip that
// produced it, so the reader does not have to count commas.
func emptyElementReason(position, total int) string {
	var slip string
	switch position {
	case 1:
		slip = "the set starts with a comma"
	case total:
		slip = "the set ends with a comma"
	default:
		slip = "two commas in a row"
	}
	return fmt.Sprintf("element %d is empty (%s)", position, slip)
}

// overlapError describes two elements that share buckets. The element
// written later in the spec is the offending one, since the earlier one was
// fine until it appeared. The shared buckets start where the later-starting
// element starts.
func overlapError(spec string, earlierStart, laterStart parsedElement) *SetError {
	offender, other := laterStart, earlierStart
	if offender.position < other.position {
		offender, other = other, offender
	}
	reason := fmt.Sprintf("%q overlaps %q (bucket %d is in both)", offender.token, other.token, laterStart.lo)
	if offender.token == other.token {
		reason = fmt.Sprintf("%q is listed twice", offender.token)
	}
	return &SetError{Spec: spec, Token: offender.token, Reason: reason}
}

// parseElement parses one trimmed, non-empty element: "7" or "3-7". It
// returns the range, or a reason the element is refused. The upper bound is
// checked by the caller, which knows the fleet's count.
func parseElement(token string) (span, string) {
	notBuckets := fmt.Sprintf("%q is not a bucket number or a range of them", token)
	if strings.IndexFunc(token, unicode.IsSpace) >= 0 {
		// "1 2" is most likely a missing comma, "0 - 31" a stray space.
		return span{}, fmt.Sprintf("%q has a space inside it; spaces are allowed only around the commas", token)
	}
	dash := strings.IndexByte(token, '-')
	if dash < 0 {
		v, ok, reason := parseNumber(token)
		if reason != "" {
			return span{}, reason
		}
		if !ok {
			return span{}, notBuckets
		}
		return span{v, v}, ""
	}
	if dash == 0 {
		// "-1" reads as a negative number; say so rather than calling it
		// malformed.
		if _, ok, _ := parseNumber(token[1:]); ok {
			return span{}, fmt.Sprintf("%q is negative; buckets are numbered from 0", token)
		}
		return span{}, notBuckets
	}
	left, right := token[:dash], token[dash+1:]
	if strings.Contains(right, "-") {
		return span{}, fmt.Sprintf("%q has more than one %q; a range is written lo-hi", token, "-")
	}
	if right == "" {
		return span{}, fmt.Sprintf("range %q has no upper end", token)
	}
	lo, okLo, reason := parseNumber(left)
	if reason != "" {
		return span{}, reason
	}
	hi, okHi, reason := parseNumber(right)
	if reason != "" {
		return span{}, reason
	}
	if !okLo || !okHi {
		return span{}, notBuckets
	}
	if lo > hi {
		return span{}, fmt.Sprintf("range %q runs backwards; write it as \"%d-%d\"", token, hi, lo)
	}
	return span{lo, hi}, ""
}

// parseNumber parses a non-negative decimal number made only of ASCII
// digits. Unlike strconv.Atoi it refuses signs ("+1"), so that only what
// String could have written is read. ok is false when text is not such a
// number; reason is set when it is one, but too large to hold.
func parseNumber(text string) (value int, ok bool, reason string) {
	if text == "" {
		return 0, false, ""
	}
	for i := range len(text) {
		if text[i] < '0' || text[i] > '9' {
			return 0, false, ""
		}
	}
	for i := range len(text) {
		digit := int(text[i] - '0')
		if value > (math.MaxInt-digit)/10 {
			return 0, false, fmt.Sprintf("%q is too large to be a bucket number; no fleet has more than %d buckets", text, MaxCount)
		}
		value = value*10 + digit
	}
	return value, true, ""
}
