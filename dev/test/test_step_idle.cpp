// Tests of the step idle-time report (dev/profile/step_idle.h) on made-up kernel traces.
#include "dev/profile/step_idle.h"
#include "dev/test/testing.h"

#include <math.h>

static bool near(double a, double b) { return fabs(a - b) < 1e-9; }

// Two streams: a step of 100 ns from the end of one "adamw" to the end of the next.
static std::vector<KernelSpan> two_steps() {
    return {
        {0, 10, 1, "adamw_kernel(float4*)"},
        {15, 40, 1, "void layernorm_forward_kernel<6>(float*, int)"},
        {30, 60, 2, "sm90_gemm_kernel"},         // overlaps the layernorm on the side stream
        {70, 100, 1, "void attention<(Kind)0, 64>(float*)"},  // 10 ns idle before it
        {100, 110, 1, "adamw_kernel(float4*)"},  // first step ends at 110
        {112, 150, 1, "void layernorm_forward_kernel<6>(float*, int)"},
        {150, 210, 1, "adamw_kernel(float4*)"},  // second step: 2 ns idle, ends at 210
    };
}

TEST(short_names_drop_arguments_not_template_parameters) {
    CHECK(short_kernel_name("void layernorm_forward_kernel<6>(float*, int)") == "layernorm_forward_kernel<6>");
    CHECK(short_kernel_name("void f<(Kind)0, 64>(float*)") == "f<(Kind)0, 64>");
    CHECK(short_kernel_name("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n") == "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n");
}

TEST(busy_time_is_the_union_over_streams) {
    StepIdleReport r = step_idle_report(two_steps(), "adamw", 0);
    CHECK(r.steps == 2);
    CHECK(near(r.wall, 100));
    // step 1: busy 15..60 and 70..110 = 85; step 2: 112..210 = 98
    CHECK(near(r.busy, (85 + 98) / 2.0));
    // step 1: 25 + 30 + 30 + 10 = 95; step 2: 38 + 60 = 98
    CHECK(near(r.kernel_sum, (95 + 98) / 2.0));
}

TEST(gaps_are_named_by_the_kernels_around_them) {
    StepIdleReport r = step_idle_report(two_steps(), "adamw", 0);
    CHECK(r.gaps.size() == 2);
    CHECK(r.gaps[0].before == "sm90_gemm_kernel" && r.gaps[0].after == "attention<(Kind)0, 64>");
    CHECK(near(r.gaps[0].ns_per_step, 5) && near(r.gaps[0].count_per_step, 0.5));
    // the 5 ns at the first step's start and the 2 at the second's: (step start) -> layernorm
    CHECK(r.gaps[1].before == "(step start)" && r.gaps[1].after == "layernorm_forward_kernel<6>");
    CHECK(near(r.gaps[1].ns_per_step, 3.5) && near(r.gaps[1].count_per_step, 1));
}

TEST(skipped_steps_and_kernels_across_a_step_boundary) {
    std::vector<KernelSpan> spans = two_steps();
    spans.push_back({205, 230, 2, "side_kernel"});  // runs past the second step's end
    StepIdleReport r = step_idle_report(spans, "adamw", 1);
    CHECK(r.steps == 1);
    CHECK(near(r.wall, 100) && near(r.busy, 98));
    CHECK(near(r.kernel_sum, 38 + 60 + 5));  // only its part inside the step
}

TEST(a_kernel_from_the_step_before_covers_the_start) {
    std::vector<KernelSpan> spans = two_steps();
    spans.push_back({95, 120, 2, "long_side_kernel"});  // starts in the first step, ends in the second
    StepIdleReport r = step_idle_report(spans, "adamw", 1);
    CHECK(r.steps == 1);
    CHECK(near(r.busy, 100));  // 110..120 from it, then 112..210: no idle at the step's start
    CHECK(near(r.kernel_sum, 10 + 38 + 60));
    CHECK(r.gaps.empty());
}

TEST(too_few_markers_give_no_step) {
    std::vector<KernelSpan> spans = {{0, 10, 1, "adamw_kernel"}, {20, 30, 1, "other"}};
    StepIdleReport r = step_idle_report(spans, "adamw", 0);
    CHECK(r.steps == 0);
    FILE* devnull = fopen("/dev/null", "w");
    print_step_idle_report(devnull, r, 5);  // says so instead of dividing by zero
    fclose(devnull);
}

TEST_MAIN()
