# Database layer (docs/control_plane.md, "Database"): the SQL abstraction, the
# Store, and the VM list importer that flytctl links without any database.
#
# SQLite is linked statically (GPU hosts may lack libsqlite3); libpq is loaded
# with dlopen("libpq.so.5") at run time, so its header is needed to build but
# nothing links libpq.
find_library(FLYT_SQLITE3_STATIC NAMES libsqlite3.a REQUIRED)
find_path(FLYT_SQLITE3_INCLUDE_DIR sqlite3.h REQUIRED)
find_path(FLYT_LIBPQ_INCLUDE_DIR libpq-fe.h PATH_SUFFIXES postgresql REQUIRED)

add_library(flyt_store_import STATIC src/store/vm_import.cc)
target_include_directories(flyt_store_import PUBLIC ${FLYT_JSON_INCLUDE_DIR})
target_link_libraries(flyt_store_import PUBLIC flyt_common)

add_library(flyt_store STATIC src/store/store.cc src/store/sql_database.cc
                              src/store/sqlite_database.cc src/store/postgres_database.cc)
target_include_directories(flyt_store PUBLIC ${FLYT_JSON_INCLUDE_DIR}
                           PRIVATE ${FLYT_SQLITE3_INCLUDE_DIR} ${FLYT_LIBPQ_INCLUDE_DIR})
target_link_libraries(flyt_store PUBLIC flyt_common Threads::Threads
                      PRIVATE ${FLYT_SQLITE3_STATIC} ${CMAKE_DL_LIBS} m)

if(FLYT_BUILD_TESTS)
  add_executable(store_test tests/unit/store_test.cc)
  target_link_libraries(store_test PRIVATE flyt_store GTest::gtest_main)
  # SQLite variant: every test but the PostgreSQL ones, one ctest test each.
  gtest_discover_tests(store_test TEST_PREFIX "store." TEST_FILTER "-*Postgres*")
  # PostgreSQL variant: the same typed suite against a throwaway server. Without
  # a server (FLYT_TEST_POSTGRES_URL unset) these tests fail; they never skip.
  add_test(NAME store.postgresql
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/support/pg_server.py --
                   $<TARGET_FILE:store_test> --gtest_filter=*Postgres*)
  set_tests_properties(store.postgresql PROPERTIES TIMEOUT 300)

  add_executable(vm_import_test tests/unit/vm_import_test.cc)
  target_link_libraries(vm_import_test PRIVATE flyt_store_import GTest::gtest_main)
  gtest_discover_tests(vm_import_test TEST_PREFIX "vm_import.")
endif()
