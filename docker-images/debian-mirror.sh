# Sourced by the image builds: the Debian mirrors this machine's apt already uses, for mmdebstrap.
#
# find_mirror SUITE prints the URI of the first enabled binary source for SUITE in /etc/apt/sources.list*
# (one-line or deb822). After sourcing, $mirror, $updates and $security hold the three sources of $suite
# (bookworm unless the caller set it; SANDBOX_DEBIAN_MIRROR overrides the main one), falling back to
# deb.debian.org.

find_mirror() {
    local wanted=$1 file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $file ]] || continue
        awk -v s="$wanted" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) { print $i; exit }
            }' "$file"
    done
    for file in /etc/apt/sources.list.d/*.sources; do
        [[ -f $file ]] || continue
        awk -v s="$wanted" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uri = ""; has_suite = 0; enabled = 1; binary = 0
                for (i = 1; i <= NF; i++) {
                    line = $i
                    if (line ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", line); split(line, a, /[ \t]+/); uri = a[1] }
                    else if (line ~ /^Suites:/) {
                        sub(/^Suites:[ \t]*/, "", line); n = split(line, a, /[ \t]+/)
                        for (j = 1; j <= n; j++) if (a[j] == s) has_suite = 1
                    }
                    else if (line ~ /^Types:/) {
                        sub(/^Types:[ \t]*/, "", line); n = split(line, a, /[ \t]+/)
                        for (j = 1; j <= n; j++) if (a[j] == "deb") binary = 1
                    }
                    else if (line ~ /^Enabled:[ \t]*[Nn]o/) enabled = 0
                }
                if (uri != "" && has_suite && enabled && binary) { print uri; exit }
            }' "$file"
    done
}

suite=${suite:-bookworm}
mirror=${SANDBOX_DEBIAN_MIRROR:-$(find_mirror "$suite" | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
updates=$(find_mirror "$suite-updates" | head -n 1)
updates=${updates:-$mirror}
security=$(find_mirror "$suite-security" | head -n 1)
security=${security:-http://deb.debian.org/debian-security}
