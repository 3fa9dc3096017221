# cmake -DBUILD=<sneppx build> -DWORK=<scratch dir> -DCC=<compiler> -P check_install.cmake
# Installs the build into WORK/prefix with `cmake --install --prefix` (not the
# configured prefix), then builds consumer.c against it twice, as another
# project would: with pkg-config (sneppx.pc) and with find_package(sneppx);
# both programs must run and print the same line.
cmake_minimum_required(VERSION 3.20)
foreach(variable BUILD WORK CC)
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

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
file(GLOB pc_file ${prefix}/*/pkgconfig/sneppx.pc ${prefix}/*/*/pkgconfig/sneppx.pc)
if(NOT pc_file)
  message(FATAL_ERROR "no sneppx.pc under ${prefix}")
endif()
get_filename_component(pc_dir ${pc_file} DIRECTORY)
get_filename_component(libdir ${pc_dir} DIRECTORY)

set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run(pkg-config --cflags --libs sneppx)
string(STRIP "${output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} ${CMAKE_CURRENT_LIST_DIR}/consumer.c ${flags} -o ${WORK}/consumer_pkgconfig)
set(ENV{LD_LIBRARY_PATH} ${libdir})
run(${WORK}/consumer_pkgconfig)
set(pkgconfig_line "${output}")
unset(ENV{LD_LIBRARY_PATH})

run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${WORK}/consumer -DCMAKE_C_COMPILER=${CC}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/consumer)
set(find_package_line "${output}")

if(NOT pkgconfig_line MATCHES "^SNEPPX_OK [-0-9.]+\n$" OR NOT pkgconfig_line STREQUAL find_package_line)
  message(FATAL_ERROR "pkg-config build printed '${pkgconfig_line}', find_package build '${find_package_line}'")
endif()
# The programs linked the installed library, not the build tree's.
run(ldd ${WORK}/consumer/consumer)
if(NOT output MATCHES "libsneppx[^\n]*=> ${libdir}/libsneppx")
  message(FATAL_ERROR "the find_package build does not load ${libdir}/libsneppx.so:\n${output}")
endif()
message(STATUS "installed into ${prefix}: pkg-config and find_package builds both print ${pkgconfig_line}")
