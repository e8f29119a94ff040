// A CUPTI injection library: loaded into any CUDA program through CUDA_INJECTION64_PATH, it records
// every kernel's, copy's and memset's start and end on the GPU (graph nodes included) and, when the
// program exits, writes where its steps left the GPU idle (step_idle.h):
//   CUDA_INJECTION64_PATH=build/libkernel_trace.so ./train_gpt2_fp32 -x 12 ...
// KERNEL_TRACE_REPORT: the report's file (default: stderr); KERNEL_TRACE_MARKER: the kernel that
// ends each step (default adamw_kernel); KERNEL_TRACE_SKIP: steps not counted (default 2: graph
// capture and warm-up); KERNEL_TRACE_CSV: also every span as start,end,stream,name (ns).
// Built against CUDA 13's CUPTI (its kernel record, CUpti_ActivityKernel10). scripts/bench.sh
// --idle runs it.
#include <cupti.h>
#include <cxxabi.h>
#include <stdlib.h>

#include <mutex>

#include "dev/profile/step_idle.h"

static std::mutex g_mutex;
static std::vector<KernelSpan> g_spans;
static const size_t BUFFER_BYTES = 16 << 20;

static void cupti_check(CUptiResult result, const char* what) {
    if (result == CUPTI_SUCCESS) { return; }
    const char* message = NULL;
    cuptiGetResultString(result, &message);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, message != NULL ? message : "unknown error");
    exit(EXIT_FAILURE);
}

static std::string demangled(const char* name) {
    int status = 0;
    char* readable = abi::__cxa_demangle(name, NULL, NULL, &status);
    std::string result = status == 0 ? readable : name;
    free(readable);
    return result;
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = (uint8_t*)aligned_alloc(8, BUFFER_BYTES);
    *size = BUFFER_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
    CUpti_Activity* record = NULL;
    std::lock_guard<std::mutex> lock(g_mutex);
    while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10* kernel = (const CUpti_ActivityKernel10*)record;
            g_spans.push_back({kernel->start, kernel->end, kernel->streamId, demangled(kernel->name)});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6* copy = (const CUpti_ActivityMemcpy6*)record;
            g_spans.push_back({copy->start, copy->end, copy->streamId, "[copy " + std::to_string(copy->bytes) + " B]"});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4* set = (const CUpti_ActivityMemset4*)record;
            g_spans.push_back({set->start, set->end, set->streamId, "[memset " + std::to_string(set->bytes) + " B]"});
        }
    }
    free(buffer);
}

static int env_int(const char* name, int fallback) {
    const char* value = getenv(name);
    return value != NULL ? atoi(value) : fallback;
}

static FILE* open_or_exit(const char* path) {
    FILE* file = fopen(path, "w");
    if (file == NULL) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        exit(EXIT_FAILURE);
    }
    return file;
}

static void write_report() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (const char* csv_path = getenv("KERNEL_TRACE_CSV")) {
        FILE* csv = open_or_exit(csv_path);
        for (const KernelSpan& k : g_spans) {
            fprintf(csv, "%llu,%llu,%u,%s\n", (unsigned long long)k.start, (unsigned long long)k.end, k.stream,
                    k.name.c_str());
        }
        fclose(csv);
    }
    const char* marker = getenv("KERNEL_TRACE_MARKER");
    StepIdleReport report = step_idle_report(g_spans, marker != NULL ? marker : "adamw_kernel",
                                             env_int("KERNEL_TRACE_SKIP", 2));
    const char* report_path = getenv("KERNEL_TRACE_REPORT");
    FILE* out = report_path != NULL ? open_or_exit(report_path) : stderr;
    print_step_idle_report(out, report, 12);
    if (out != stderr) { fclose(out); }
}

// Called by the CUDA driver when it starts, before the program's first kernel.
extern "C" int InitializeInjection(void) {
    cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    for (CUpti_ActivityKind kind :
         {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET}) {
        cupti_check(cuptiActivityEnable(kind), "cuptiActivityEnable");
    }
    cupti_check(cuptiActivityFlushPeriod(100), "cuptiActivityFlushPeriod");  // ms: the buffers drain as it runs
    atexit(write_report);
    return 1;
}
