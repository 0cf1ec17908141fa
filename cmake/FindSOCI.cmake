# FindSOCI: Debian's libsoci-dev ships no CMake package config, so locate it by hand.
#
# Components: core (always), postgresql, sqlite3.
# Imported targets: SOCI::core, SOCI::postgresql, SOCI::sqlite3.
# Result variables: SOCI_FOUND, SOCI_INCLUDE_DIR, SOCI_<component>_FOUND.

find_path(SOCI_INCLUDE_DIR NAMES soci/soci.h)
find_library(SOCI_core_LIBRARY NAMES soci_core)

set(_soci_required_vars SOCI_INCLUDE_DIR SOCI_core_LIBRARY)
if(SOCI_INCLUDE_DIR AND SOCI_core_LIBRARY)
  set(SOCI_core_FOUND TRUE)
  if(NOT TARGET SOCI::core)
    add_library(SOCI::core UNKNOWN IMPORTED)
    set_target_properties(SOCI::core PROPERTIES
      IMPORTED_LOCATION "${SOCI_core_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${SOCI_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}")
  endif()
endif()

foreach(_comp IN LISTS SOCI_FIND_COMPONENTS)
  if(_comp STREQUAL "core")
    continue()
  endif()
  find_library(SOCI_${_comp}_LIBRARY NAMES soci_${_comp})
  if(SOCI_${_comp}_LIBRARY AND SOCI_core_FOUND)
    set(SOCI_${_comp}_FOUND TRUE)
    if(NOT TARGET SOCI::${_comp})
      add_library(SOCI::${_comp} UNKNOWN IMPORTED)
      set(_soci_deps SOCI::core)
      if(_comp STREQUAL "postgresql")
        find_package(PostgreSQL QUIET)
        if(PostgreSQL_FOUND)
          list(APPEND _soci_deps PostgreSQL::PostgreSQL)
        endif()
      elseif(_comp STREQUAL "sqlite3")
        find_package(SQLite3 QUIET)
        if(SQLite3_FOUND)
          list(APPEND _soci_deps SQLite::SQLite3)
        endif()
      endif()
      set_target_properties(SOCI::${_comp} PROPERTIES
        IMPORTED_LOCATION "${SOCI_${_comp}_LIBRARY}"
        INTERFACE_LINK_LIBRARIES "${_soci_deps}")
    endif()
  else()
    set(SOCI_${_comp}_FOUND FALSE)
  endif()
endforeach()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SOCI
  REQUIRED_VARS ${_soci_required_vars}
  HANDLE_COMPONENTS)
mark_as_advanced(SOCI_INCLUDE_DIR SOCI_core_LIBRARY SOCI_postgresql_LIBRARY SOCI_sqlite3_LIBRARY)
