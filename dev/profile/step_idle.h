// Where a training step leaves the GPU idle, from a trace of its kernels (and copies: start and end
// times on the GPU, any stream): a step runs from the end of one marker kernel (the optimizer's) to
// the end of the next; its busy time is the union of the spans' intervals, its idle time the rest,
// and each idle interval is named by the span that ended last before it and the one that ended it.
// Pure C++: kernel_trace.cpp (a CUPTI injection library) feeds it on a GPU; dev/test/test_step_idle.cpp
// checks it on made-up traces.
#pragma once

#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

struct KernelSpan {
    uint64_t start, end;  // ns
    uint32_t stream;
    std::string name;
};

struct IdleGap {
    std::string before, after;  // the kernel that ended last before the gap, the one that started after it
    double ns_per_step;
    double count_per_step;
};

// Means over the steps measured, in ns.
struct StepIdleReport {
    int steps = 0;
    double wall = 0, busy = 0, kernel_sum = 0;
    std::vector<IdleGap> gaps;  // largest total first
};

// "layernorm_forward_kernel<6>" from "void layernorm_forward_kernel<6>(float*, ...)"; cuBLAS's
// kernels keep their names (the tile shape is in them).
static inline std::string short_kernel_name(const std::string& name) {
    std::string s = name.compare(0, 5, "void ") == 0 ? name.substr(5) : name;
    int depth = 0;
    for (size_t i = 0; i < s.size(); i++) {  // the first '(' outside template arguments
        if (s[i] == '<') { depth++; }
        else if (s[i] == '>') { depth--; }
        else if (s[i] == '(' && depth == 0) { return s.substr(0, i); }
    }
    return s;
}

// The steps after the first skip_steps (graph capture, warm-up), between consecutive ends of
// kernels whose name contains marker; a kernel counts for the part of it inside the step.
static inline StepIdleReport step_idle_report(std::vector<KernelSpan> spans, const std::string& marker,
                                              int skip_steps) {
    std::sort(spans.begin(), spans.end(), [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
    std::vector<uint64_t> ends;
    uint64_t longest = 0;  // no span starts more than this before a step and still reaches into it
    for (const KernelSpan& k : spans) {
        if (k.name.find(marker) != std::string::npos) { ends.push_back(k.end); }
        longest = std::max(longest, k.end - k.start);
    }
    std::sort(ends.begin(), ends.end());
    StepIdleReport report;
    std::map<std::pair<std::string, std::string>, std::pair<double, int>> gaps;
    for (size_t s = (size_t)skip_steps + 1; s < ends.size(); s++) {
        uint64_t from = ends[s - 1], to = ends[s], covered = from, busy = 0, kernel_sum = 0;
        std::string last = "(step start)";
        auto first = std::lower_bound(spans.begin(), spans.end(), from - std::min(from, longest),
                                      [](const KernelSpan& k, uint64_t t) { return k.start < t; });
        for (auto it = first; it != spans.end() && it->start < to; ++it) {
            const KernelSpan& k = *it;
            if (k.end <= from) { continue; }
            uint64_t start = std::max(k.start, from), end = std::min(k.end, to);
            kernel_sum += end - start;
            if (start > covered) {
                auto& gap = gaps[{last, short_kernel_name(k.name)}];
                gap.first += start - covered;
                gap.second++;
            }
            if (end > covered) {
                busy += end - std::max(start, covered);
                covered = end;
                last = short_kernel_name(k.name);
            }
        }
        report.steps++;
        report.wall += to - from;
        report.busy += busy;
        report.kernel_sum += kernel_sum;
    }
    if (report.steps == 0) { return report; }
    report.wall /= report.steps;
    report.busy /= report.steps;
    report.kernel_sum /= report.steps;
    for (auto& [names, total] : gaps) {
        report.gaps.push_back({names.first, names.second, total.first / report.steps,
                               (double)total.second / report.steps});
    }
    std::sort(report.gaps.begin(), report.gaps.end(),
              [](const IdleGap& a, const IdleGap& b) { return a.ns_per_step > b.ns_per_step; });
    return report;
}

static inline void print_step_idle_report(FILE* out, const StepIdleReport& r, size_t top) {
    if (r.steps == 0) {
        fprintf(out, "step idle: no complete step (too few marker kernels)\n");
        return;
    }
    double idle = r.wall - r.busy;
    fprintf(out, "step idle: %d steps, step %.3f ms, a kernel or copy running %.3f ms, idle %.3f ms (%.2f%%); "
                 "their summed time %.3f ms (streams overlap)\n",
            r.steps, r.wall / 1e6, r.busy / 1e6, idle / 1e6, 100 * idle / r.wall, r.kernel_sum / 1e6);
    for (size_t i = 0; i < std::min(top, r.gaps.size()); i++) {
        const IdleGap& g = r.gaps[i];
        fprintf(out, "  %8.1f us idle per step in %5.1f gaps (%5.1f us each): %s -> %s\n", g.ns_per_step / 1e3,
                g.count_per_step, g.ns_per_step / 1e3 / g.count_per_step, g.before.substr(0, 60).c_str(),
                g.after.substr(0, 60).c_str());
    }
}
