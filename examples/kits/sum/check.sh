#!/bin/sh
# The sum kit's check (POSIX sh and awk only).
#
# The controller runs it in the kit's folder, with THERMITE_OUT naming the
# run's out/ folder and THERMITE_HIDDEN the hidden cases (check.hidden,
# space-separated). For every expected/<case>.txt it compares the run's
# out/<case>.txt line by line (fields compared, white space ignored) and
# prints the one JSON object the judge reads:
#
#   {"score": <public cases passed / public cases>,
#    "cases": {"<case>": {"ok": …, "matched": …, "lines": …}, …}}
#
# Every case is reported; the judge keeps the hidden ones out of sight. The
# score counts the public cases only: an aggregate over the hidden ones
# would show what they hide.
#
# out/ was written by the run, so it is read as hostile: a symlink, a FIFO
# or anything but a regular file counts as a missing output and is never
# opened.
set -u
out=${THERMITE_OUT:?must name the out folder of the run}
hidden=${THERMITE_HIDDEN?must list the hidden cases (empty for none)}

is_hidden() {
	for h in $hidden; do
		[ "$h" = "$1" ] && return 0
	done
	return 1
}

passed=0
total=0
cases=""
for exp in expected/*.txt; do
	[ -f "$exp" ] || continue
	name=${exp#expected/}
	name=${name%.txt}
	case $name in
	*[!A-Za-z0-9_-]*|"")
		echo "check.sh: $exp: a case name is letters, digits, _ and - only" >&2
		exit 2
		;;
	esac
	got=$out/$name.txt
	public=1
	if is_hidden "$name"; then
		public=0
	fi
	total=$((total + public))
	if [ -f "$got" ] && [ ! -h "$got" ] && [ -r "$got" ]; then
		res=$(awk '
			function norm(   i, s) { s = $1; for (i = 2; i <= NF; i++) s = s " " $i; return s }
			FILENAME == ARGV[1] { want[FNR] = norm(); n = FNR; next }
			{ got++; if (FNR <= n && norm() == want[FNR]) matched++ }
			END {
				ok = (matched == n && got == n) ? "true" : "false"
				printf "{\"ok\": %s, \"matched\": %d, \"lines\": %d}", ok, matched, n
			}' "$exp" "$got")
	else
		lines=$(awk 'END { print NR }' "$exp")
		res="{\"ok\": false, \"missing\": true, \"matched\": 0, \"lines\": $lines}"
	fi
	case $res in
	'{"ok": true,'*) passed=$((passed + public)) ;;
	esac
	cases="$cases${cases:+, }\"$name\": $res"
done

score=$(awk -v p="$passed" -v t="$total" 'BEGIN { if (t == 0) print 0; else printf "%.6g\n", p / t }')
printf '{"score": %s, "cases": {%s}}\n' "$score" "$cases"
