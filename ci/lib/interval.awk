# awk -f ci/lib/interval.awk [-v digits=N]: reads numbers (per-run ratios, one per
# line, any order) and prints "MEDIAN (LO-HI)": their median and a 95%
# confidence interval for it from their order statistics, the sign test's
# interval, which assumes nothing about their distribution: with n values
# sorted, [x_k, x_(n+1-k)] for the largest k with P(Bin(n, 1/2) < k) <=
# 0.025 (the 2nd to 8th of 9, the 6th to 16th of 21). Fewer than 6 values
# have no such interval ("MEDIAN (n/a)"); none at all print "n/a".
# Used by ci/bench, ci/bench-lat and ci/bench-cmtime.
BEGIN { if (digits == "") digits = 3 }
NF { v[++n] = $1 + 0 }
END {
    if (n == 0) { print "n/a"; exit }
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    f = "%." digits "f"
    med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    # cum = P(B <= j - 1) at step j; k ends as the largest j with it <= 0.025.
    p = 0.5 ^ n; cum = 0; k = 0
    for (j = 1; j <= n; j++) { cum += p; if (cum > 0.025) break; k = j; p = p * (n - j + 1) / j }
    printf f " (%s)\n", med, k ? sprintf(f "-" f, v[k], v[n + 1 - k]) : "n/a"
}
