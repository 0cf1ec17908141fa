#pragma once
/// \file
/// The dashboard's pages, rendered on the server. Every value that comes from the database goes
/// through escape(): queue names, kinds, args and errors are user data.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cli/admin.hpp"
#include "tenure/job.hpp"

namespace tenure::serve {

/// Text made safe inside an HTML element or a quoted attribute: & < > " ' become entities.
std::string escape(std::string_view text);
/// Text made safe as one query-string value or path segment (RFC 3986 unreserved kept).
std::string url_encode(std::string_view text);

/// `/`: queues with their counts per state and paused flag, and the finished jobs per minute.
std::string render_overview(const std::vector<cli::admin::queue_row>& queues,
                            const std::vector<cli::admin::minute_count>& minutes, bool actions);
/// `/jobs`: the filter form, one page of jobs and the link to the next.
std::string render_jobs(const cli::admin::job_page& page, const cli::admin::job_filter& filter, int limit,
                        std::int64_t after_id, bool actions);
/// `/jobs/{id}`: every field of one job, with retry and cancel.
std::string render_job(const job_info& job, const cli::admin::attempt_info& attempt, bool actions);
/// An error page.
std::string render_error(unsigned status, std::string_view message, bool actions);
/// The chart: completed and failed jobs per minute as an inline SVG (no script needed).
std::string render_chart(const std::vector<cli::admin::minute_count>& minutes);

}  // namespace tenure::serve
