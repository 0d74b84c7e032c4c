// Package baseline keeps the designs a team would build without allot, so
// that benchmarks and the load generator can measure allot against them on
// the same MariaDB/MySQL server:
//
//   - SeedJoin and SeedCancel: the seed waitlist, one transaction
//     per request serialised by SELECT … FOR UPDATE on the activity row;
//   - SeedClaim: the seed flash sale's claim, a conditional
//     UPDATE … WHERE remaining > 0 plus a UNIQUE (player_id, item_id) key;
//   - GatedClaim: SeedClaim behind the seed flash sale's Redis DECR gate;
//   - Floor: no design at all, claims counted in the server's memory with
//     nothing stored, the least a claim costs over HTTP.
//
// The seed designs live in their own seed_ tables, created by Migrate,
// next to allot's; the floor needs none.
// Drive runs any of them from many goroutines and measures it; Handler
// serves them over allot's HTTP routes and JSON shapes so that the same load
// generator can drive allot and a baseline alike. The code follows the
// seed designs on purpose, including their limits: it is the yardstick, not a
// design to copy.
package baseline
