package store

import (
	"strconv"
	"strings"
)

// IntList formats ids for an SQL IN list: integers only, so no placeholder
// is needed and none can inject. The audit builds its IN lists with it too.
func IntList(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}
