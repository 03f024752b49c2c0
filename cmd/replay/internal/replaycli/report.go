package replaycli

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// printReport writes a command's report to w, for a person to read.
func printReport(w io.Writer, report any) {
	switch r := report.(type) {
	case CopyResult:
		verb := "copied"
		if r.DryRun {
			verb = "would copy (dry run)"
		}
		fmt.Fprintf(w, "%s %d record(s) from %s to %s as %d record(s) in %s\n", verb, r.Read, r.From, r.To, r.Written, r.Elapsed)
		for _, s := range r.Spans {
			fmt.Fprintf(w, "  partition %d: offsets %d..%d\n", s.Partition, s.From, s.To)
		}
	case RewindPlan:
		state := "plan (dry run; add --execute to apply)"
		if r.Executed {
			state = "applied"
		}
		fmt.Fprintf(w, "rewind of group %s on %s: %s; %d record(s) will be delivered again\n", r.Group, r.Topic, state, r.Redelivered)
		for _, m := range r.Moves {
			fmt.Fprintf(w, "  partition %d: %d -> %d\n", m.Partition, m.Current, m.New)
		}
	case RedriveReport:
		fmt.Fprintf(w, "%s: %d dead letter(s), %d selected\n", r.DeadLetterTopic, r.Read, len(r.Letters))
		for _, l := range r.Letters {
			state := ""
			switch {
			case l.Outcome != "":
				state = " [" + l.Outcome + "]"
			case l.RedrivenAt != nil && l.Uncertain:
				state = " [" + uncertainOutcome + "]"
			case l.RedrivenAt != nil:
				state = " [redriven " + l.RedrivenAt.UTC().Format(time.RFC3339) + "]"
			}
			if l.OffsetReused {
				state += " [" + offsetReusedNote + "]"
			}
			fmt.Fprintf(w, "  %d/%d %s key=%q id=%q from %s (handler %s): %s%s\n", l.Partition, l.Offset, l.Time.UTC().Format(time.RFC3339),
				l.Key, l.ID, l.Source, l.Handler, l.Reason, state)
		}
		if r.Executed {
			fmt.Fprintf(w, "redrove %d record(s); skipped %d\n", r.Redriven, r.Skipped)
		} else {
			fmt.Fprintf(w, "list only: add --execute to publish them back (those not redriven yet)\n")
		}
	case RebuildReport:
		state := "plan (dry run; add --execute to apply)"
		if r.Executed {
			state = "done"
		}
		prev := r.PreviousGroup
		if prev == "" {
			prev = "none recorded"
		}
		fmt.Fprintf(w, "rebuild of scope %s on %s: %s\n  keys retired   %d\n  truncated      %s\n  group          %s (before: %s)\n",
			r.Scope, r.Topic, state, r.RetiredKeys, strings.Join(r.Truncated, ", "), r.Group, prev)
		if r.LostBefore > 0 {
			fmt.Fprintf(w, "  warning: %d record(s) of %s are no longer in Kafka (retention): the rebuild cannot apply them\n", r.LostBefore, r.Topic)
		}
		if r.Executed {
			fmt.Fprintf(w, "start the workers with group %s now (worker.Config.Group)\n", r.Group)
		}
	case PositionsReport:
		fmt.Fprintf(w, "positions of group %s on %s: Kafka's committed offset, the database's position, the gap\n", r.Group, r.Topic)
		off := func(o int64) string {
			if o < 0 {
				return "none"
			}
			return fmt.Sprint(o)
		}
		for _, p := range r.Partitions {
			note := ""
			switch {
			case p.Kafka < 0 && p.Database >= 0:
				note = " (no offset in Kafka: the consumer starts at the database's position)"
			case p.Database < 0:
				note = " (no position in the database)"
			case p.Gap > 0:
				note = fmt.Sprintf(" (the database is behind: %d record(s) delivered again)", p.Gap)
			case p.Gap < 0:
				note = " (Kafka is behind: its last commit did not happen)"
			}
			if p.Unrecoverable {
				note += fmt.Sprintf("; records from %d to %d are no longer in Kafka", p.Database, p.LogStart-1)
			}
			fmt.Fprintf(w, "  partition %d: kafka %s, database %s, gap %d, log %d..%d%s\n", p.Partition, off(p.Kafka), off(p.Database), p.Gap, p.LogStart, p.LogEnd, note)
		}
		fmt.Fprintf(w, "%d record(s) behind in the database\n", r.Behind)
	case VerifyReport:
		verdict := "PASS: nothing was applied twice"
		if !r.Pass {
			verdict = "FAIL: the replay changed the state"
			if r.ReApplied > 0 {
				verdict += fmt.Sprintf(" (%d key(s) applied again)", r.ReApplied)
			}
		}
		fmt.Fprintf(w, `replay verify of %s (group %s)
  replayed       %d
  deduplicated   %d
  re-applied     %d
  key reused     %d
  expired keys   %d (records older than the key TTL)
  untracked      %d (no key: not claimed by the dedupe middleware)
  checksum       %s… (%d rows) -> %s… (%d rows)
%s
`, r.Topic, r.Group, r.Replayed, r.Deduplicated, r.ReApplied, r.KeyReused, r.ExpiredKeys, r.Untracked,
			short(r.ChecksumBefore), r.RowsBefore, short(r.ChecksumAfter), r.RowsAfter, verdict)
	}
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}
