package backfill

import (
	"crypto/sha256"
	"fmt"
)

// maxCursorsRemembered bounds the cursors one listing remembers. When the
// set is full it starts over, so any cycle of at most this many pages is
// still caught within two of its turns, and memory stays bounded
// (16 bytes a cursor) however long a repository or relay listing is.
const maxCursorsRemembered = 4096

// cursorTrail remembers the cursors of one paginated listing (one relay
// listing of a collection, one repository's records) so that a peer whose
// cursors cycle (c2 -> c1 -> c2 ...) is caught instead of being paged
// forever. The listing's starting cursor (a resumed checkpoint) counts as
// seen, so a resumed run cannot loop either.
type cursorTrail struct {
	seen map[[16]byte]struct{}
}

// newCursorTrail starts a trail at start ("" for the first page).
func newCursorTrail(start string) *cursorTrail {
	t := &cursorTrail{seen: map[[16]byte]struct{}{}}
	if start != "" {
		t.add(start)
	}
	return t
}

// add records next, the cursor a page pointed to; false when the listing
// already went through it.
func (t *cursorTrail) add(next string) bool {
	sum := sha256.Sum256([]byte(next))
	var k [16]byte
	copy(k[:], sum[:])
	if _, ok := t.seen[k]; ok {
		return false
	}
	if len(t.seen) >= maxCursorsRemembered {
		clear(t.seen)
	}
	t.seen[k] = struct{}{}
	return true
}

// cycleMessage explains a cursor the listing already went through.
func cycleMessage(who, cursor string) string {
	return fmt.Sprintf("%s returned cursor %q, which this listing already went through (the pages cycle)", who, cursor)
}
