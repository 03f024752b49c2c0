package txguard

import "testing"

func TestEndsTx(t *testing.T) {
	for sql, want := range map[string]string{
		"COMMIT":                                  "COMMIT (as SQL)",
		"  commit work":                           "COMMIT (as SQL)",
		"end":                                     "END (as SQL)",
		"abort":                                   "ABORT (as SQL)",
		"rollback":                                "ROLLBACK (as SQL)",
		"ROLLBACK AND CHAIN":                      "ROLLBACK (as SQL)",
		"rollback to savepoint a":                 "",
		"ROLLBACK TO a":                           "",
		"prepare transaction 'x'":                 "PREPARE TRANSACTION",
		"PREPARE q AS SELECT 1":                   "",
		"UPDATE t SET a = 1; COMMIT":              "COMMIT (as SQL)",
		"UPDATE t SET a = 1;\ncommit;":            "COMMIT (as SQL)",
		"INSERT INTO t VALUES ('x; commit')":      "",
		`SELECT "a;commit" FROM t`:                "",
		"SELECT 1 -- ; commit\n":                  "",
		"/* ; commit */ SELECT 1":                 "",
		"/* c */ COMMIT":                          "COMMIT (as SQL)",
		"SELECT commit_id FROM commits":           "",
		"UPDATE ends SET n = 1":                   "",
		"savepoint a; release savepoint a":        "",
		"SELECT 'it''s'; COMMIT":                  "COMMIT (as SQL)",
		"INSERT INTO t VALUES ('a'); ABORT; x":    "ABORT (as SQL)",
		"DO $$ BEGIN RAISE EXCEPTION 'x'; END $$": "",
		"DO $f$ BEGIN PERFORM 1; END $f$; COMMIT": "COMMIT (as SQL)",
		"SELECT $1::int; END":                     "END (as SQL)",
		"SELECT $1, $2":                           "",
		`SELECT E'\''; COMMIT AND CHAIN`:          "COMMIT (as SQL)",
		"SELECT 1 AS a$b$; COMMIT AND CHAIN; SELECT 1 AS c$b$": "COMMIT (as SQL)",
		"ROLLBACK WORK TO SAVEPOINT s":                         "",
		"ROLLBACK TRANSACTION TO s":                            "",
		"/* a /* nested */ ; end */ SELECT 1":                  "",
		`SELECT E'don\'t; commit later'`:                       "",
		`SELECT e'x\\'; COMMIT`:                                "COMMIT (as SQL)",
		`SELECT 'a\'; COMMIT`:                                  "COMMIT (as SQL)",
		"COMMIT PREPARED 'x'":                                  "",
	} {
		if got := endsTx(sql); got != want {
			t.Errorf("endsTx(%q) = %q, want %q", sql, got, want)
		}
	}
}
