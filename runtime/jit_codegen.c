/* Code generation of a key's module (jit_codegen.h).
 *
 * Code generation is about half of a compile (llc -time-passes on the
 * biggest keys: instruction selection, loop strength reduction, register
 * allocation), and it works function by function, so a key's functions can
 * be emitted on two threads: one part here, the other in a thread of its
 * own, each from the module's bitcode read back in an LLVM context of its own
 * (contexts are not shared between threads). Each part keeps the other's
 * functions as declarations, so every function is emitted once, from the
 * same optimized IR as an undivided emit (which reads the bitcode back too:
 * codegen follows the order of each value's uses, and reading bitcode sets
 * it): the split changes where code lies, not what it is. */
#include "jit_codegen.h"

#include <llvm-c/BitReader.h>
#include <llvm-c/BitWriter.h>
#include <llvm-c/Error.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "host.h"
#include "object_bundle.h"

/* A function's codegen cost: its instructions plus BLOCK_COST per basic
 * block (instruction selection runs per block, strength reduction per
 * loop; fitted to llc's times of an int8 GEMM key's eight functions, which
 * this predicts within about 1.5x). */
#define BLOCK_COST 20
/* A divided compile reads the bitcode twice, makes a second target machine
 * and starts a thread, about 2 ms in all: a part worth less than about 5 ms
 * of codegen (~90 cost units a ms on Zen 5) is not worth it. */
#define SPLIT_MIN_PART_COST 450
#define PARTS 2

LLVMTargetMachineRef sneppx_jit_host_machine(char *error, size_t error_size)
{
    const sneppx_host *h = sneppx_host_info();
    LLVMTargetRef target;
    char *message = NULL;
    if (LLVMGetTargetFromTriple(h->triple, &target, &message)) {
        snprintf(error, error_size, "LLVM has no target for host triple '%s': %s", h->triple, message);
        LLVMDisposeMessage(message);
        return NULL;
    }
    /* Small code model with PIC: JITLink places each object's sections
     * together and reaches the process (libm) through GOT/PLT stubs. */
    return LLVMCreateTargetMachine(target, h->triple, h->cpu, h->features, LLVMCodeGenLevelAggressive,
                                   LLVMRelocPIC, LLVMCodeModelSmall);
}

/* An LLVM context's error diagnostics, kept instead of LLVM's default
 * handler printing them and exiting the process. */
static void keep_error_diagnostic(LLVMDiagnosticInfoRef info, void *context)
{
    struct sneppx_jit_diagnostics *kept = context;
    if (LLVMGetDiagInfoSeverity(info) != LLVMDSError || kept->message[0])
        return;
    char *description = LLVMGetDiagInfoDescription(info);
    snprintf(kept->message, sizeof kept->message, "%s", description);
    LLVMDisposeMessage(description);
}

void sneppx_jit_keep_diagnostics(LLVMContextRef context, struct sneppx_jit_diagnostics *kept)
{
    kept->message[0] = '\0';
    LLVMContextSetDiagnosticHandler(context, keep_error_diagnostic, kept);
}

/* Emits module as one object; NULL with why in error. */
static LLVMMemoryBufferRef emit_object(LLVMTargetMachineRef machine, LLVMModuleRef module, char *error,
                                       size_t error_size)
{
    char *message = NULL;
    LLVMMemoryBufferRef object = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(machine, module, LLVMObjectFile, &message, &object)) {
        snprintf(error, error_size, "LLVM code generation failed: %s", message ? message : "(no message)");
        LLVMDisposeMessage(message);
        return NULL;
    }
    return object;
}

/* ---- dividing the functions ------------------------------------------------ */

struct costed_function {
    LLVMValueRef function;
    long cost;
    int part;
    int shared; /* called from the other part (mark_shared_functions) */
};

static int is_local(LLVMValueRef f)
{
    const LLVMLinkage linkage = LLVMGetLinkage(f);
    return linkage == LLVMInternalLinkage || linkage == LLVMPrivateLinkage;
}

static long codegen_cost(LLVMValueRef function)
{
    long cost = 0;
    for (LLVMBasicBlockRef block = LLVMGetFirstBasicBlock(function); block; block = LLVMGetNextBasicBlock(block)) {
        cost += BLOCK_COST;
        for (LLVMValueRef instruction = LLVMGetFirstInstruction(block); instruction;
             instruction = LLVMGetNextInstruction(instruction))
            cost++;
    }
    return cost;
}

static int by_cost_descending(const void *a, const void *b)
{
    const long x = ((const struct costed_function *)a)->cost, y = ((const struct costed_function *)b)->cost;
    return (x < y) - (x > y);
}

/* A copy of the module may hold every global only if none is written: each
 * part keeps its own copy of a constant. Aliases and ifuncs are not split
 * (the kernels have none). */
static int globals_copyable(LLVMModuleRef module)
{
    for (LLVMValueRef global = LLVMGetFirstGlobal(module); global; global = LLVMGetNextGlobal(global))
        if (!LLVMIsDeclaration(global) && !LLVMIsGlobalConstant(global))
            return 0;
    return !LLVMGetFirstGlobalAlias(module) && !LLVMGetFirstGlobalIFunc(module);
}

/* The defined functions, largest first, each given the part with less cost
 * so far (longest processing time first). Returns their count (0 when out
 * of memory); *functions is malloc'd. */
static int divide(LLVMModuleRef module, struct costed_function **functions, long part_cost[PARTS])
{
    int count = 0;
    for (LLVMValueRef f = LLVMGetFirstFunction(module); f; f = LLVMGetNextFunction(f))
        count += !LLVMIsDeclaration(f);
    *functions = count ? malloc((size_t)count * sizeof **functions) : NULL;
    if (!*functions)
        return 0;
    int i = 0;
    for (LLVMValueRef f = LLVMGetFirstFunction(module); f; f = LLVMGetNextFunction(f))
        if (!LLVMIsDeclaration(f))
            (*functions)[i++] = (struct costed_function){.function = f, .cost = codegen_cost(f)};
    qsort(*functions, (size_t)count, sizeof **functions, by_cost_descending);
    for (int p = 0; p < PARTS; p++)
        part_cost[p] = 0;
    for (i = 0; i < count; i++) {
        int lightest = 0;
        for (int p = 1; p < PARTS; p++)
            lightest = part_cost[p] < part_cost[lightest] ? p : lightest;
        (*functions)[i].part = lightest;
        part_cost[lightest] += (*functions)[i].cost;
    }
    return count;
}

/* The part of the function holding a use of a value; -1 when the user is not
 * an instruction (a constant expression, a global's initializer). */
static int part_of_user(LLVMValueRef user, const struct costed_function *functions, int count)
{
    if (!LLVMIsAInstruction(user))
        return -1;
    LLVMValueRef parent = LLVMGetBasicBlockParent(LLVMGetInstructionParent(user));
    for (int i = 0; i < count; i++)
        if (functions[i].function == parent)
            return functions[i].part;
    return -1;
}

/* 1 when a use of function f is a direct call of it (f the callee, not an argument). */
static int is_direct_call(LLVMValueRef user, LLVMValueRef f)
{
    if (!LLVMIsACallInst(user) || LLVMGetCalledValue(user) != f)
        return 0;
    for (unsigned a = 0; a < LLVMGetNumArgOperands(user); a++)
        if (LLVMGetOperand(user, a) == f)
            return 0;
    return 1;
}

/* Marks each function used outside its own part; -1 when such a use is not a
 * direct call. A protected function is reached PC-relative; JITLink gives a
 * call that cannot reach a stub, but not an address taken, and the parts'
 * objects may land far apart. */
static int mark_shared_functions(struct costed_function *functions, int count)
{
    for (int i = 0; i < count; i++) {
        functions[i].shared = 0;
        for (LLVMUseRef use = LLVMGetFirstUse(functions[i].function); use; use = LLVMGetNextUse(use)) {
            LLVMValueRef user = LLVMGetUser(use);
            if (part_of_user(user, functions, count) == functions[i].part)
                continue;
            if (!is_direct_call(user, functions[i].function))
                return -1;
            functions[i].shared = 1;
        }
    }
    return 0;
}

/* Every function called from the other part gets protected visibility (the
 * other part declares it and calls it directly) and, if it was internal, a
 * name of the key's. -1 when out of memory (some may be renamed: the module
 * must not be emitted then, its code would differ from an undivided one). */
static int export_shared_functions(const struct costed_function *functions, int count, const char *symbol_prefix)
{
    for (int i = 0; i < count; i++) {
        LLVMValueRef f = functions[i].function;
        if (!functions[i].shared)
            continue;
        if (is_local(f)) {
            size_t length;
            const char *name = LLVMGetValueName2(f, &length);
            size_t size = strlen(symbol_prefix) + 2 + length + 1;
            char *exported = malloc(size);
            if (!exported)
                return -1;
            snprintf(exported, size, "%s__%.*s", symbol_prefix, (int)length, name);
            LLVMSetValueName2(f, exported, strlen(exported));
            free(exported);
            LLVMSetLinkage(f, LLVMExternalLinkage);
        }
        LLVMSetVisibility(f, LLVMProtectedVisibility);
    }
    return 0;
}

static void free_names(char **names, int count)
{
    for (int i = 0; names && i < count; i++)
        free(names[i]);
    free(names);
}

/* The names of one part's externally visible functions: what the other part
 * drops. NULL when out of memory. */
static char **names_of_part(const struct costed_function *functions, int count, int part, int *name_count)
{
    char **names = calloc((size_t)count, sizeof *names);
    *name_count = 0;
    for (int i = 0; names && i < count; i++) {
        if (functions[i].part != part || is_local(functions[i].function))
            continue;
        if (!(names[*name_count] = strdup(LLVMGetValueName(functions[i].function)))) {
            free_names(names, *name_count);
            return NULL;
        }
        ++*name_count;
    }
    return names;
}

/* Turns the named functions into declarations; the internal functions only
 * they called, and constants only they read, go with them. */
static int drop_functions(LLVMModuleRef module, LLVMTargetMachineRef machine, char *const *names, int count,
                          char *error, size_t error_size)
{
    for (int i = 0; i < count; i++) {
        LLVMValueRef f = LLVMGetNamedFunction(module, names[i]);
        if (f && !LLVMIsDeclaration(f))
            LLVMSetLinkage(f, LLVMAvailableExternallyLinkage);
    }
    LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
    LLVMErrorRef failure = LLVMRunPasses(module, "elim-avail-extern,globaldce", machine, options);
    LLVMDisposePassBuilderOptions(options);
    if (failure) {
        char *message = LLVMGetErrorMessage(failure);
        snprintf(error, error_size, "dropping the other part's functions failed: %s", message);
        LLVMDisposeErrorMessage(message);
        return -1;
    }
    return 0;
}

/* ---- emitting a part ---------------------------------------------------------- */

/* One part's job: read the module back from its bitcode in a context of its
 * own, drop the other part's functions, emit the rest. */
struct part {
    LLVMMemoryBufferRef bitcode;  /* the whole module, shared functions exported */
    LLVMTargetMachineRef machine; /* NULL: the part makes its own */
    char **drop;                  /* the other part's functions */
    int drop_count;
    LLVMMemoryBufferRef object;   /* out: NULL on failure */
    char error[512];              /* out */
};

static void *emit_part(void *argument)
{
    struct part *part = argument;
    LLVMContextRef context = LLVMContextCreate();
    LLVMContextSetDiscardValueNames(context, 1); /* as the module's own context (jit.c) */
    struct sneppx_jit_diagnostics diagnostics;
    sneppx_jit_keep_diagnostics(context, &diagnostics);
    LLVMModuleRef module = NULL;
    LLVMTargetMachineRef machine = part->machine;
    if (LLVMParseBitcodeInContext2(context, part->bitcode, &module)) {
        snprintf(part->error, sizeof part->error, "reading back the module's bitcode failed: %s",
                 diagnostics.message);
        module = NULL;
    } else if ((machine || (machine = sneppx_jit_host_machine(part->error, sizeof part->error))) &&
               (part->drop_count == 0 ||
                drop_functions(module, machine, part->drop, part->drop_count, part->error, sizeof part->error) == 0)) {
        part->object = emit_object(machine, module, part->error, sizeof part->error);
    }
    if (machine && machine != part->machine)
        LLVMDisposeTargetMachine(machine);
    if (module)
        LLVMDisposeModule(module);
    LLVMContextDispose(context);
    return NULL;
}

/* ---- the bundle ------------------------------------------------------------- */

sneppx_status sneppx_jit_emit_bundle(LLVMModuleRef module, LLVMTargetMachineRef machine, const char *key,
                                     const char *symbol_prefix, int threads, void **bundle, size_t *bundle_size)
{
    struct costed_function *functions = NULL;
    long part_cost[PARTS];
    const int count = threads >= PARTS && globals_copyable(module) ? divide(module, &functions, part_cost) : 0;
    const long lighter = count >= PARTS ? (part_cost[0] < part_cost[1] ? part_cost[0] : part_cost[1]) : 0;
    const int parts =
        lighter >= SPLIT_MIN_PART_COST && mark_shared_functions(functions, count) == 0 ? PARTS : 1;
    struct part part[PARTS] = {{.machine = machine}, {.machine = NULL}};
    sneppx_status status = SNEPPX_OK;
    if (parts == PARTS) {
        if (export_shared_functions(functions, count, symbol_prefix) != 0)
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory dividing kernel '%s'", key);
        for (int p = 0; p < PARTS && status == SNEPPX_OK; p++)
            if (!(part[p].drop = names_of_part(functions, count, PARTS - 1 - p, &part[p].drop_count)))
                status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory dividing kernel '%s'", key);
    }
    free(functions);
    if (status != SNEPPX_OK)
        goto done;
    /* Every part, the one of an undivided module too, is emitted from the
     * bitcode: reading it back orders each value's uses as a copy does, and
     * some codegen passes walk uses in that order; so a key's code is the
     * same whether it was divided or not. */
    LLVMMemoryBufferRef bitcode = LLVMWriteBitcodeToMemoryBuffer(module);
    for (int p = 0; p < parts; p++)
        part[p].bitcode = bitcode;
    pthread_t thread;
    const int threaded = parts == PARTS && pthread_create(&thread, NULL, emit_part, &part[1]) == 0;
    emit_part(&part[0]);
    if (threaded) {
        pthread_join(thread, NULL);
    } else if (parts == PARTS) {
        part[1].machine = machine; /* no thread to be had: the same work, one part after the other */
        emit_part(&part[1]);
    }
    LLVMDisposeMemoryBuffer(bitcode);
    struct sneppx_object_span spans[PARTS];
    for (int p = 0; p < parts && status == SNEPPX_OK; p++) {
        if (!part[p].object)
            status = sneppx_fail(SNEPPX_ERR_JIT, "kernel '%s'%s: %s", key,
                                 parts == 1 ? "" : p == 0 ? ", first part" : ", second part", part[p].error);
        else
            spans[p] = (struct sneppx_object_span){LLVMGetBufferStart(part[p].object),
                                                   LLVMGetBufferSize(part[p].object)};
    }
    if (status == SNEPPX_OK)
        status = sneppx_bundle_make(spans, parts, bundle, bundle_size);
done:
    for (int p = 0; p < PARTS; p++) {
        free_names(part[p].drop, part[p].drop_count);
        if (part[p].object)
            LLVMDisposeMemoryBuffer(part[p].object);
    }
    return status;
}
