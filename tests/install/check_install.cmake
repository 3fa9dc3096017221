# cmake -DBUILD=<sneppx build> -DWORK=<scratch dir> -DCC=<compiler> -DEXAMPLE=<examples/quickstart.c>
#       -P check_install.cmake
# Installs the build into WORK/prefix with `cmake --install --prefix` (not the
# configured prefix), then builds the README's C example against it four ways,
# as another project would: pkg-config and find_package(sneppx), each with the
# shared and the static library. Every program must run and print the same
# lines; the shared ones must load the installed libsneppx, the static ones
# none; and the installed tools must run without LD_LIBRARY_PATH.
cmake_minimum_required(VERSION 3.20)
foreach(variable BUILD WORK CC EXAMPLE)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "check_install.cmake: -D${variable}=... is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "${command}: exit ${status}\n${out}${err}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

# The program's libsneppx: the installed shared one, or none (static).
function(check_links program expect_shared)
  run(ldd ${program})
  if(expect_shared AND NOT output MATCHES "libsneppx[^\n]*=> (${libdir}|${prefix}/bin/\\.\\./lib)/libsneppx")
    message(FATAL_ERROR "${program} does not load ${libdir}/libsneppx.so:\n${output}")
  elseif(NOT expect_shared AND output MATCHES "libsneppx")
    message(FATAL_ERROR "${program}, linked statically, loads a libsneppx:\n${output}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
file(GLOB pc_file ${prefix}/*/pkgconfig/sneppx.pc ${prefix}/*/*/pkgconfig/sneppx.pc)
if(NOT pc_file)
  message(FATAL_ERROR "no sneppx.pc under ${prefix}")
endif()
get_filename_component(pc_dir ${pc_file} DIRECTORY)
get_filename_component(libdir ${pc_dir} DIRECTORY)
unset(ENV{LD_LIBRARY_PATH})

# Installed tools: RPATH $ORIGIN/../lib finds the installed library.
run(${prefix}/bin/sneppx-run --help)
check_links(${prefix}/bin/sneppx-run TRUE)

set(lines "")
# pkg-config, shared: the user gives the run-time path, as for any library outside the system's.
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run(pkg-config --cflags --libs sneppx)
string(STRIP "${output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c11 ${EXAMPLE} ${flags} -Wl,-rpath,${libdir} -o ${WORK}/quickstart_pkgconfig_shared)
check_links(${WORK}/quickstart_pkgconfig_shared TRUE)
run(${WORK}/quickstart_pkgconfig_shared)
list(APPEND lines "${output}")

# pkg-config, static: --static adds Libs.private and the Requires.private
# packages' flags; -l:libsneppx.a picks the archive where both are installed.
run(pkg-config --cflags --libs --static sneppx)
string(STRIP "${output}" flags)
string(REPLACE "-lsneppx" "-l:libsneppx.a" flags "${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c11 ${EXAMPLE} ${flags} -o ${WORK}/quickstart_pkgconfig_static)
check_links(${WORK}/quickstart_pkgconfig_static FALSE)
run(${WORK}/quickstart_pkgconfig_static)
list(APPEND lines "${output}")

# find_package(sneppx): sneppx::sneppx and sneppx::sneppx_static.
foreach(kind shared static)
  set(target sneppx::sneppx)
  set(shared TRUE)
  if(kind STREQUAL "static")
    set(target sneppx::sneppx_static)
    set(shared FALSE)
  endif()
  run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${WORK}/cmake_${kind} -DCMAKE_C_COMPILER=${CC}
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DSNEPPX_TARGET=${target} -DEXAMPLE=${EXAMPLE})
  run(${CMAKE_COMMAND} --build ${WORK}/cmake_${kind})
  check_links(${WORK}/cmake_${kind}/quickstart ${shared})
  run(${WORK}/cmake_${kind}/quickstart)
  list(APPEND lines "${output}")
endforeach()

list(GET lines 0 first)
if(NOT first MATCHES "^y\\[0, 15, 0:3\\] = [-0-9.]+ [-0-9.]+ [-0-9.]+\nkernels:\n")
  message(FATAL_ERROR "the example printed:\n${first}")
endif()
foreach(line IN LISTS lines)
  if(NOT line STREQUAL first)
    message(FATAL_ERROR "the four builds disagree:\n${first}\nand\n${line}")
  endif()
endforeach()
message(STATUS "installed into ${prefix}: pkg-config and find_package, shared and static, all print:\n${first}")
