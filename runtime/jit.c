/* The LLVM JIT: embedded bitcode -> specialized module -> host-optimized
 * object -> linked into one process-wide ORC LLJIT.
 *
 * The recipe (measured with LLVM 19): the bitcode is clang output with only
 * the key-independent cleanups run (gen/CMakeLists.txt); each spec_<field>
 * global becomes a constant with the key's value, the entries get names
 * unique to the key, clang's per-function
 * target-cpu/target-features/tune-cpu are replaced by the host's (they
 * override the target machine: without this there is no zmm), then
 * the family's pass pipeline (its jit_pipeline, gen/sneppx_gen/jit_pipelines.py
 * says why each) runs with a host TargetMachine, which emits the object. Every
 * kernel, compiled or read from the disk cache, reaches the JIT as an object
 * bundle (one object, or two when code generation ran on two threads:
 * jit_codegen.c), so a cache hit runs exactly the code a miss compiled. */
#include "jit.h"

#include <llvm-c/BitReader.h>
#include <llvm-c/Core.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "host.h"
#include "jit_codegen.h"
#include "object_bundle.h"
#include "perf_map.h"

/* Changing any of these changes the code: the string below is part of every
 * disk cache fingerprint (with the family's pipeline), so keep the two in step. */
#define JIT_OPTIONS                                                                \
    "loop-vectorize loop-interleave slp-vectorize loop-unroll; "                   \
    "codegen aggressive pic small-code-model, by function in up to 2 parts; "      \
    "host attributes; internalized; object bundle"

#define SPEC_PREFIX "spec_"
#define TEMPLATE_ENTRY "sneppx_kernel"

const char *sneppx_jit_options(void) { return JIT_OPTIONS; }

int sneppx_jit_allowed(void)
{
    static atomic_int allowed = -1; /* threads racing here all store the same value */
    int value = atomic_load_explicit(&allowed, memory_order_relaxed);
    if (value < 0) {
        const char *env = getenv("SNEPPX_JIT");
        value = !(env && strcmp(env, "0") == 0);
        atomic_store_explicit(&allowed, value, memory_order_relaxed);
    }
    return value;
}

/* ---- specialization ---------------------------------------------------- */

/* Consumes an LLVMErrorRef into a sneppx error that names the step and key. */
static sneppx_status fail_llvm(LLVMErrorRef error, const char *step, const char *key)
{
    char *message = LLVMGetErrorMessage(error);
    sneppx_status status = sneppx_fail(SNEPPX_ERR_JIT, "LLVM %s failed for kernel '%s': %s", step, key, message);
    LLVMDisposeErrorMessage(message);
    return status;
}

static LLVMTargetMachineRef create_host_target_machine(const char *key)
{
    char error[256];
    LLVMTargetMachineRef machine = sneppx_jit_host_machine(error, sizeof error);
    if (!machine)
        sneppx_fail(SNEPPX_ERR_JIT, "kernel '%s': %s", key, error);
    return machine;
}

static void replace_string_attribute(LLVMContextRef context, LLVMValueRef function, const char *name,
                                     const char *value)
{
    unsigned name_length = (unsigned)strlen(name);
    LLVMRemoveStringAttributeAtIndex(function, LLVMAttributeFunctionIndex, name, name_length);
    if (value[0] != '\0')
        LLVMAddAttributeAtIndex(function, LLVMAttributeFunctionIndex,
                                LLVMCreateStringAttribute(context, name, name_length, value,
                                                          (unsigned)strlen(value)));
}

static int is_entry_name(const struct sneppx_kernel_family *family, const char *symbol_prefix,
                         const char *name)
{
    size_t prefix_length = strlen(symbol_prefix);
    if (strncmp(name, symbol_prefix, prefix_length) != 0)
        return 0;
    for (int i = 0; i < family->entry_count; i++)
        if (strcmp(name + prefix_length, family->entry_suffixes[i]) == 0)
            return 1;
    return 0;
}

/* The C symbol of a key's entry: sneppx_ + key with - and . as _ + suffix
 * (gen/sneppx_gen/kernels.py:symbol_of_key). */
static void entry_symbol(const char *key, const char *suffix, char *symbol, size_t symbol_size)
{
    snprintf(symbol, symbol_size, "sneppx_%s%s", key, suffix);
    for (char *c = symbol + strlen("sneppx_"); *c; c++)
        if (*c == '-' || *c == '.')
            *c = '_';
}

/* The spec_ globals take the key's values and become internal constants, so
 * every trip count and branch on them folds. */
static sneppx_status specialize_globals(LLVMModuleRef module, const struct sneppx_kernel_family *family,
                                        const int64_t *values, const char *key)
{
    LLVMTypeRef int64 = LLVMInt64TypeInContext(LLVMGetModuleContext(module));
    for (int i = 0; i < family->field_count; i++) {
        char name[96];
        snprintf(name, sizeof name, SPEC_PREFIX "%s", family->field_names[i]);
        LLVMValueRef global = LLVMGetNamedGlobal(module, name);
        if (!global)
            continue; /* the template does not read this field (clang dropped the declaration) */
        if (LLVMGlobalGetValueType(global) != int64)
            return sneppx_fail(SNEPPX_ERR_JIT, "bitcode of kernel '%s': global %s is not an int64_t",
                               key, name);
        LLVMSetInitializer(global, LLVMConstInt(int64, (unsigned long long)values[i], 1));
        LLVMSetGlobalConstant(global, 1);
        LLVMSetLinkage(global, LLVMInternalLinkage);
    }
    return SNEPPX_OK;
}

/* Entries get the key's unique names; every other definition becomes
 * internal, so two keys of one family never define the same symbol in the
 * JIT and the optimizer may inline and drop helpers freely. */
static sneppx_status rename_and_internalize(LLVMModuleRef module, const struct sneppx_kernel_family *family,
                                            const char *key)
{
    for (int i = 0; i < family->entry_count; i++) {
        char template_name[64], symbol[SNEPPX_KEY_MAX + 64];
        snprintf(template_name, sizeof template_name, TEMPLATE_ENTRY "%s", family->entry_suffixes[i]);
        LLVMValueRef function = LLVMGetNamedFunction(module, template_name);
        if (!function || LLVMIsDeclaration(function))
            return sneppx_fail(SNEPPX_ERR_JIT, "bitcode of kernel '%s' defines no entry %s", key, template_name);
        entry_symbol(key, family->entry_suffixes[i], symbol, sizeof symbol);
        LLVMSetValueName2(function, symbol, strlen(symbol));
    }
    char symbol_prefix[SNEPPX_KEY_MAX + 16];
    entry_symbol(key, "", symbol_prefix, sizeof symbol_prefix);
    for (LLVMValueRef f = LLVMGetFirstFunction(module); f; f = LLVMGetNextFunction(f)) {
        const char *name = LLVMGetValueName(f);
        if (!LLVMIsDeclaration(f) && !is_entry_name(family, symbol_prefix, name))
            LLVMSetLinkage(f, LLVMInternalLinkage);
    }
    for (LLVMValueRef g = LLVMGetFirstGlobal(module); g; g = LLVMGetNextGlobal(g)) {
        const char *name = LLVMGetValueName(g);
        if (!LLVMIsDeclaration(g) && strncmp(name, "llvm.", 5) != 0)
            LLVMSetLinkage(g, LLVMInternalLinkage);
    }
    return SNEPPX_OK;
}

/* clang's attributes name the build machine's CPU (or none); they override
 * the target machine, so the host's replace them on every definition. */
static void set_host_attributes(LLVMModuleRef module)
{
    const sneppx_host *h = sneppx_host_info();
    LLVMContextRef context = LLVMGetModuleContext(module);
    for (LLVMValueRef f = LLVMGetFirstFunction(module); f; f = LLVMGetNextFunction(f)) {
        if (LLVMIsDeclaration(f))
            continue;
        replace_string_attribute(context, f, "target-cpu", h->cpu);
        replace_string_attribute(context, f, "tune-cpu", h->cpu);
        replace_string_attribute(context, f, "target-features", h->features);
    }
}

static sneppx_status optimize(LLVMModuleRef module, LLVMTargetMachineRef machine, const char *pipeline,
                              const char *key)
{
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    /* The C API leaves SLP vectorization off; clang -O3 turns it on. */
    LLVMPassBuilderOptionsSetLoopVectorization(options, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(options, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(options, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(options, 1);
    LLVMErrorRef error = LLVMRunPasses(module, pipeline, machine, options);
    LLVMDisposePassBuilderOptions(options);
    return error ? fail_llvm(error, pipeline, key) : SNEPPX_OK;
}

/* The one path that turns embedded bitcode into the module of a key, shared
 * by the JIT and sneppx-ir. On success *module lives in *context (the
 * caller disposes both) and *machine is the host target machine. */
static sneppx_status build_module(const struct sneppx_kernel_family *family, const int64_t *values,
                                  const struct sneppx_target *target, sneppx_jit_stage stage, const char *passes,
                                  LLVMContextRef *context, LLVMModuleRef *module, LLVMTargetMachineRef *machine)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_status status = sneppx_kernel_key(family->family, values, target, key, sizeof key);
    if (status != SNEPPX_OK)
        return status;
    const struct sneppx_embedded_bitcode *bitcode = sneppx_kernel_bitcode_find(family->family, target);
    if (!bitcode)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "kernel '%s': this build embeds no bitcode for %s on target %s",
                           key, family->family, target->name);

    *machine = create_host_target_machine(key);
    if (!*machine)
        return SNEPPX_ERR_JIT;
    /* A context per compile: LLVM contexts are not shared between threads.
     * Local value names are dropped as the bitcode is read and never made by
     * the passes (as clang does in release builds): no pass reads them, and the
     * objects are the same to the byte, with less string work; the IR text
     * numbers its values instead. */
    *context = LLVMContextCreate();
    LLVMContextSetDiscardValueNames(*context, 1);
    *module = NULL;
    struct sneppx_jit_diagnostics diagnostics;
    sneppx_jit_keep_diagnostics(*context, &diagnostics);
    LLVMMemoryBufferRef buffer = LLVMCreateMemoryBufferWithMemoryRange(
        (const char *)bitcode->data, bitcode->size, bitcode->family, 0);
    LLVMBool parse_failed = LLVMParseBitcodeInContext2(*context, buffer, module);
    LLVMDisposeMemoryBuffer(buffer);
    if (parse_failed) {
        status = sneppx_fail(SNEPPX_ERR_JIT, "embedded bitcode of %s %s is unreadable by LLVM %s (kernel '%s'): %s",
                             family->family, target->name, SNEPPX_LLVM_VERSION, key, diagnostics.message);
        goto fail;
    }
    /* Later diagnostics (none expected from a verified module) go to LLVM's handler again, since
     * diagnostics lives on this stack frame only. */
    LLVMContextSetDiagnosticHandler(*context, NULL, NULL);
    if ((status = specialize_globals(*module, family, values, key)) != SNEPPX_OK ||
        (status = rename_and_internalize(*module, family, key)) != SNEPPX_OK)
        goto fail;
    set_host_attributes(*module);
    LLVMSetTarget(*module, sneppx_host_info()->triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(*machine);
    LLVMSetModuleDataLayout(*module, layout);
    LLVMDisposeTargetData(layout);

    char *message = NULL;
    if (LLVMVerifyModule(*module, LLVMReturnStatusAction, &message)) {
        status = sneppx_fail(SNEPPX_ERR_JIT, "specialized module of kernel '%s' is invalid: %s", key, message);
        LLVMDisposeMessage(message);
        goto fail;
    }
    LLVMDisposeMessage(message);
    const char *pipeline = passes ? passes : family->jit_pipeline;
    if (stage == SNEPPX_JIT_STAGE_OPTIMIZED && (status = optimize(*module, *machine, pipeline, key)) != SNEPPX_OK)
        goto fail;
    return SNEPPX_OK;

fail:
    if (*module)
        LLVMDisposeModule(*module);
    LLVMContextDispose(*context);
    LLVMDisposeTargetMachine(*machine);
    return status;
}

static void dispose_module(LLVMContextRef context, LLVMModuleRef module, LLVMTargetMachineRef machine)
{
    LLVMDisposeModule(module);
    LLVMContextDispose(context);
    LLVMDisposeTargetMachine(machine);
}

sneppx_status sneppx_jit_module_ir(const struct sneppx_kernel_family *family, const int64_t *values,
                                   const struct sneppx_target *target, sneppx_jit_stage stage, const char *passes,
                                   char **ir)
{
    LLVMContextRef context;
    LLVMModuleRef module;
    LLVMTargetMachineRef machine;
    sneppx_status status = build_module(family, values, target, stage, passes, &context, &module, &machine);
    if (status != SNEPPX_OK)
        return status;
    char *text = LLVMPrintModuleToString(module);
    *ir = strdup(text);
    LLVMDisposeMessage(text);
    dispose_module(context, module, machine);
    return *ir ? SNEPPX_OK : sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory printing the IR of a %s kernel",
                                         family->family);
}

/* ---- how many threads a compile's code generation gets ------------------ */

/* Compiles running in the process, plus the second threads of divided ones. */
static atomic_int compile_threads;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int forced_threads; /* SNEPPX_JIT_THREADS, or 0 */
static int process_cpus;

static void read_thread_settings(void)
{
    cpu_set_t set;
    process_cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const char *env = getenv("SNEPPX_JIT_THREADS");
    if (!env || !env[0])
        return;
    if (strcmp(env, "1") == 0 || strcmp(env, "2") == 0)
        forced_threads = env[0] - '0';
    else
        sneppx_log(0, "warning: SNEPPX_JIT_THREADS='%s' is not 1 or 2; ignored (a compile takes a second "
                   "thread when a core is free)", sneppx_clip(env).text);
}

/* The threads code generation may use, taken when the module is ready (an
 * optimize takes about as long as an emit, and other compiles start and end
 * meanwhile): the caller's request, else SNEPPX_JIT_THREADS, else a second
 * thread when the process may run on more cores than it has compile threads
 * busy. A layer compiles its keys side by side, one per core: then there is
 * no core to take, and a second thread per key would only wait for one. */
static int take_codegen_threads(int requested)
{
    pthread_once(&threads_once, read_thread_settings);
    const int wanted = requested > 0 ? requested : forced_threads;
    if (wanted == 1)
        return 1;
    if (wanted == 2) {
        atomic_fetch_add(&compile_threads, 1);
        return 2;
    }
    int busy = atomic_load(&compile_threads);
    while (busy < process_cpus)
        if (atomic_compare_exchange_weak(&compile_threads, &busy, busy + 1))
            return 2;
    return 1;
}

static void give_back_codegen_threads(int threads)
{
    if (threads == 2)
        atomic_fetch_sub(&compile_threads, 1);
}

sneppx_status sneppx_jit_compile_object(const struct sneppx_kernel_family *family, const int64_t *values,
                                        const struct sneppx_target *target, int threads, void **object,
                                        size_t *object_size)
{
    char key[SNEPPX_KEY_MAX], symbol_prefix[SNEPPX_KEY_MAX + 16];
    sneppx_status status = sneppx_kernel_key(family->family, values, target, key, sizeof key);
    if (status != SNEPPX_OK)
        return status;
    entry_symbol(key, "", symbol_prefix, sizeof symbol_prefix);
    atomic_fetch_add(&compile_threads, 1);
    LLVMContextRef context;
    LLVMModuleRef module;
    LLVMTargetMachineRef machine;
    status = build_module(family, values, target, SNEPPX_JIT_STAGE_OPTIMIZED, NULL, &context, &module, &machine);
    if (status == SNEPPX_OK) {
        const int codegen_threads = take_codegen_threads(threads);
        status = sneppx_jit_emit_bundle(module, machine, key, symbol_prefix, codegen_threads, object, object_size);
        give_back_codegen_threads(codegen_threads);
        dispose_module(context, module, machine);
    }
    atomic_fetch_sub(&compile_threads, 1);
    return status;
}

/* ---- the process-wide LLJIT ---------------------------------------------- */

static LLVMOrcLLJITRef jit;
static char jit_creation_error[512]; /* empty when the JIT exists */
static pthread_once_t jit_once = PTHREAD_ONCE_INIT;
/* Serializes adding objects and looking up their entries. */
static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
/* One resource tracker per linked object, so tests can unlink them. */
static LLVMOrcResourceTrackerRef *trackers;
static size_t tracker_count, tracker_capacity;

/* Keeps the message of a failed creation step for every later caller. */
static void record_creation_error(LLVMErrorRef error, const char *step)
{
    char *message = LLVMGetErrorMessage(error); /* consumes error */
    snprintf(jit_creation_error, sizeof jit_creation_error, "%s: %s", step, message);
    LLVMDisposeErrorMessage(message);
}

static void create_jit(void)
{
    sneppx_host_info(); /* initializes the native target */
    LLVMOrcJITTargetMachineBuilderRef machine_builder;
    LLVMErrorRef error = LLVMOrcJITTargetMachineBuilderDetectHost(&machine_builder);
    if (error) {
        record_creation_error(error, "detecting the host");
        return;
    }
    LLVMOrcLLJITBuilderRef builder = LLVMOrcCreateLLJITBuilder();
    LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(builder, machine_builder);
    if ((error = LLVMOrcCreateLLJIT(&jit, builder))) {
        record_creation_error(error, "creating the LLJIT");
        return;
    }
    /* Kernels call libm (expf) and the C library (memset) of this process. */
    LLVMOrcDefinitionGeneratorRef process_symbols;
    if ((error = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
             &process_symbols, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL))) {
        record_creation_error(error, "reflecting process symbols");
        return;
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), process_symbols);
}

void sneppx_jit_prepare(void) { pthread_once(&jit_once, create_jit); }

static sneppx_status get_jit(const char *key)
{
    sneppx_jit_prepare();
    if (jit_creation_error[0])
        return sneppx_fail(SNEPPX_ERR_JIT, "cannot create the LLVM JIT (kernel '%s'): %s", key, jit_creation_error);
    return SNEPPX_OK;
}

static sneppx_status remember_tracker(LLVMOrcResourceTrackerRef tracker, const char *key)
{
    if (tracker_count == tracker_capacity) {
        size_t capacity = tracker_capacity ? 2 * tracker_capacity : 64;
        LLVMOrcResourceTrackerRef *grown = realloc(trackers, capacity * sizeof *trackers);
        if (!grown)
            return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory linking kernel '%s'", key);
        trackers = grown;
        tracker_capacity = capacity;
    }
    trackers[tracker_count++] = tracker;
    return SNEPPX_OK;
}

/* Where the JIT linked symbol; 0 if it did not (perf_map.h's lookup). */
static uint64_t linked_address(const char *symbol, void *unused)
{
    (void)unused;
    LLVMOrcExecutorAddress address = 0;
    LLVMErrorRef error = LLVMOrcLLJITLookup(jit, &address, symbol);
    if (error) {
        LLVMConsumeError(error);
        return 0;
    }
    return address;
}

sneppx_status sneppx_jit_link_object(const struct sneppx_kernel_family *family, const char *key,
                                     const void *object, size_t object_size,
                                     sneppx_kernel_fn entry[SNEPPX_ENTRY_COUNT], int *object_at_fault)
{
    for (int i = 0; i < SNEPPX_ENTRY_COUNT; i++)
        entry[i] = NULL;
    *object_at_fault = 0;
    sneppx_status status = get_jit(key);
    if (status != SNEPPX_OK)
        return status;
    struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
    int object_count = 0;
    if ((status = sneppx_bundle_unpack(object, object_size, key, objects, &object_count)) != SNEPPX_OK) {
        *object_at_fault = 1;
        return status;
    }
    pthread_mutex_lock(&jit_lock);
    LLVMOrcResourceTrackerRef tracker = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(jit));
    for (int i = 0; status == SNEPPX_OK && i < object_count; i++) {
        char name[SNEPPX_KEY_MAX + 16]; /* as LLVM's messages name the object */
        snprintf(name, sizeof name, "%s#%d", key, i);
        LLVMMemoryBufferRef buffer =
            LLVMCreateMemoryBufferWithMemoryRangeCopy(objects[i].data, objects[i].size, name);
        LLVMErrorRef error = LLVMOrcLLJITAddObjectFileWithRT(jit, tracker, buffer); /* takes the buffer */
        if (error) {
            status = fail_llvm(error, "adding the object", key);
            *object_at_fault = 1;
        }
    }
    for (int i = 0; status == SNEPPX_OK && i < family->entry_count; i++) {
        char symbol[SNEPPX_KEY_MAX + 64];
        entry_symbol(key, family->entry_suffixes[i], symbol, sizeof symbol);
        LLVMOrcExecutorAddress address = 0;
        /* The first lookup links the objects: unresolved symbols fail here. */
        LLVMErrorRef error = LLVMOrcLLJITLookup(jit, &address, symbol);
        if (error) {
            status = fail_llvm(error, "linking", key);
            *object_at_fault = 1;
        }
        entry[i] = (sneppx_kernel_fn)(uintptr_t)address;
    }
    if (status == SNEPPX_OK) {
        char symbol_prefix[SNEPPX_KEY_MAX + 16];
        entry_symbol(key, "", symbol_prefix, sizeof symbol_prefix);
        for (int i = 0; i < object_count; i++)
            sneppx_perf_map_add(key, objects[i].data, objects[i].size, symbol_prefix, linked_address, NULL);
        status = remember_tracker(tracker, key);
    }
    if (status != SNEPPX_OK) {
        /* Drop what was added, so that a retry can define the same symbols. */
        LLVMErrorRef remove_error = LLVMOrcResourceTrackerRemove(tracker);
        if (remove_error)
            LLVMConsumeError(remove_error);
        LLVMOrcReleaseResourceTracker(tracker);
        for (int i = 0; i < SNEPPX_ENTRY_COUNT; i++)
            entry[i] = NULL;
    }
    pthread_mutex_unlock(&jit_lock);
    return status;
}

void sneppx_jit_unlink_all_for_testing(void)
{
    pthread_mutex_lock(&jit_lock);
    for (size_t i = 0; i < tracker_count; i++) {
        LLVMErrorRef error = LLVMOrcResourceTrackerRemove(trackers[i]);
        if (error) {
            char *message = LLVMGetErrorMessage(error);
            sneppx_log(1, "unlinking a kernel: %s", message);
            LLVMDisposeErrorMessage(message);
        }
        LLVMOrcReleaseResourceTracker(trackers[i]);
    }
    tracker_count = 0;
    pthread_mutex_unlock(&jit_lock);
}
